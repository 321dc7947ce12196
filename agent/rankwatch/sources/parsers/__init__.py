"""Format parsers: one per framework's console format plus generic JSON, key=value and a
user regex. ``FORMATS`` is the sniff priority: specific formats before generic ones, so
the first format whose ``sniff`` accepts a line is the most specific one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import FormatParser, LogLine
from .deepspeed import DeepSpeedParser
from .generic import JsonParser, KvParser, RegexParser
from .hf import HFParser
from .lightning import LightningCsvParser, LightningParser
from .llmc import LlmcParser
from .megatron import MegatronParser
from .nanogpt import NanoGPTParser
from .olmo import OlmoParser
from .torchtitan import TorchTitanParser

# The format registry: every parser, in sniff priority. A format's name, its detection hints
# and its sniffer come from its class; the config schema's ``logs.format`` values, the demo
# trainer's and the examples' formats are held to this list by tests/test_catalogs.py.
PARSERS: tuple[type[FormatParser], ...] = (
    MegatronParser,
    DeepSpeedParser,
    TorchTitanParser,
    NanoGPTParser,
    LlmcParser,
    OlmoParser,
    LightningParser,
    LightningCsvParser,
    HFParser,
    JsonParser,
    KvParser,
)
_FACTORIES: dict[str, Callable[[], FormatParser]] = {cls.name: cls for cls in PARSERS}

FORMATS: tuple[str, ...] = (*_FACTORIES, RegexParser.name)
GENERIC: frozenset[str] = frozenset(cls.name for cls in PARSERS if cls.generic)

# Sniffing is stateless, so one instance of each serves every caller.
_SNIFFERS: tuple[tuple[str, FormatParser], ...] = tuple((n, f()) for n, f in _FACTORIES.items())

HINTS: tuple[str, ...] = tuple(dict.fromkeys(w for cls in PARSERS for w in cls.hints))


def _make_might_sniff(words: tuple[str, ...]) -> Callable[[str], bool]:
    # One chain of ``in`` tests: until a format is decided it runs on every line.
    src = "def might_sniff(text):\n    return " + " or ".join(f"{w!r} in text" for w in words) + "\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<sniff gate of {__name__}>", "exec"), ns)
    fn: Callable[[str], bool] = ns["might_sniff"]
    fn.__doc__ = "Every format's sniffable lines hold one of its hints; NCCL chatter holds none."
    return fn


_might_sniff = _make_might_sniff(HINTS)


def make_parser(name: str, *, regex: str | None = None) -> FormatParser:
    """A fresh parser (parsers keep per-stream state, so never share one)."""
    if name == "regex":
        if not regex:
            raise ValueError("format 'regex' needs a pattern (logs.regex)")
        return RegexParser(regex)
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ValueError(f"unknown log format {name!r}; known: {', '.join(FORMATS)}")
    return factory()


def sniff_format(text: str) -> str | None:
    """The first format (in ``FORMATS`` order) that claims this stripped line."""
    if len(text) < 6 or not _might_sniff(text):
        return None
    for name, parser in _SNIFFERS:
        if parser.sniff(text):
            return name
    return None


__all__ = [
    "FORMATS",
    "GENERIC",
    "HINTS",
    "PARSERS",
    "DeepSpeedParser",
    "FormatParser",
    "HFParser",
    "JsonParser",
    "KvParser",
    "LightningCsvParser",
    "LightningParser",
    "LlmcParser",
    "LogLine",
    "MegatronParser",
    "NanoGPTParser",
    "OlmoParser",
    "RegexParser",
    "TorchTitanParser",
    "make_parser",
    "sniff_format",
]
