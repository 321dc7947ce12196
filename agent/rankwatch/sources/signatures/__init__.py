"""Recognise the error text that frameworks, launchers, drivers and schedulers print.

Three parts: ``rules`` (one function per wording, each reading one line into a ``Hit``),
``catalogue`` (which lines each rule may see, in what order, the fast gate and ``classify``) and
``tracebacks`` (the state machine that gathers multi-line errors: Python tracebacks, chained
exceptions, torchelastic's failure box, per stream and rank). A new wording is a rule plus a
row of the catalogue.
"""

from __future__ import annotations

from rankwatch.sources.signatures.catalogue import (
    GATE_WORDS,
    NOT_AN_ERROR,
    SIGNATURES,
    Signature,
    classify,
    gate_words,
    may_hold_signature,
)
from rankwatch.sources.signatures.rules import Hit, message_rank, spawn_process
from rankwatch.sources.signatures.tracebacks import SignatureMatcher

__all__ = [
    "GATE_WORDS",
    "NOT_AN_ERROR",
    "SIGNATURES",
    "Hit",
    "Signature",
    "SignatureMatcher",
    "classify",
    "gate_words",
    "may_hold_signature",
    "message_rank",
    "spawn_process",
]
