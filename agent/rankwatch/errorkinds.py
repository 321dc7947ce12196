"""The kinds of error a log can report: one row each, with the fix and the crash priority.

The error signatures (``sources/signatures/``) say which text is which kind; this table
says what a kind means to the rest of the agent. It lives beside the records, not in
``sources/``, because detectors read it (the fix a finding carries, which error explains a
crash best) and detectors import no source.

``crash_priority``: when a rank dies after several errors, the one with the lowest number is
named as the cause (an OOM explains the NCCL timeout that followed, not the reverse); a kind
with none is a cause only when nothing ranked was seen. ``alert``: the Prometheus alert in
``deploy/prometheus/rankwatch.rules.yml`` that pages for it (tests/test_catalogs.py holds the
rules to it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CRASH_PRIORITY",
    "ERROR_KINDS",
    "FIXES",
    "OWN_FAILURES",
    "PEER_FAILURES",
    "RECORDED_FAILURES",
    "ErrorKind",
    "cause_text",
    "same_cause",
]


@dataclass(frozen=True, slots=True)
class ErrorKind:
    kind: str
    fix: str
    crash_priority: int | None
    alert: str


ERROR_KINDS: tuple[ErrorKind, ...] = (
    ErrorKind(
        "oom",
        "Usual fix: smaller micro-batch or sequence length, activation checkpointing, "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, or more sharding "
        "(FSDP/ZeRO).",
        crash_priority=0,
        alert="RankwatchRankCrashed",
    ),
    ErrorKind(
        "nccl_timeout",
        "A collective waited past the NCCL timeout: usually one rank is stuck or died "
        "first; its log holds the real error. Check the rank that stopped first, not this one.",
        crash_priority=4,
        alert="RankwatchNCCLFailure",
    ),
    ErrorKind(
        "nccl_error",
        "Usual causes: a peer rank died, a network/IB fault, or mismatched collectives. "
        "Set NCCL_DEBUG=INFO and check the first rank that failed.",
        crash_priority=5,
        alert="RankwatchNCCLFailure",
    ),
    ErrorKind(
        "cuda_error",
        "Rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; device-side asserts are "
        "usually out-of-range indices (labels vs vocab size, embedding ids). Illegal memory access with "
        "repeated Xid means a hardware problem: drain the node.",
        crash_priority=1,
        alert="RankwatchRankCrashed",
    ),
    ErrorKind(
        "xid",
        "An NVIDIA driver Xid error: check `nvidia-smi -q` and the node's dmesg; "
        "Xid 79/48/63/64/74/92/94/95 usually mean the GPU needs a reset or the node must be drained.",
        crash_priority=2,
        alert="RankwatchGPUFault",
    ),
    ErrorKind(
        "nan_loss",
        "The training code itself stopped on a non-finite loss or gradient. Usual fix: resume from "
        "the last good checkpoint with a lower LR or longer warmup, check the batch at this step, "
        "prefer bf16 over fp16, clip gradients.",
        crash_priority=3,
        alert="RankwatchNaNLoss",
    ),
    ErrorKind(
        "peer_error",
        "The collective backend (gloo) or the c10d store lost its connection to a peer: "
        "that peer died or exited first, and this rank's failure is its consequence. The peer's log "
        "holds the cause; `rankwatch analyze` over every rank's log names the rank that failed first.",
        crash_priority=None,
        alert="RankwatchFinding",
    ),
    ErrorKind(
        "loss_scale_collapse",
        "The fp16 loss scale has gone to (almost) nothing: the model produces inf/NaN gradients at any "
        "scale. Switch to bf16, lower the LR, or find the bad batch; resume from the last good checkpoint.",
        crash_priority=None,
        alert="RankwatchFinding",
    ),
    ErrorKind(
        "stack_dump",
        "A py-spy dump was pasted into the log: its stacks show where each thread was when it was "
        "taken (`rankwatch dumps diff` compares the dumps of several ranks).",
        crash_priority=None,
        alert="RankwatchFinding",
    ),
    ErrorKind(
        "crash",
        "The rank ended abnormally: a traceback in the evidence names the failing frame; "
        "without one, the exit code or signal says how it was stopped.",
        crash_priority=6,
        alert="RankwatchRankCrashed",
    ),
)

# A crash record of a KeyboardInterrupt traceback (``details["interrupted"]``): its fix text.
INTERRUPTED = (
    "Interrupted by SIGINT (a Ctrl-C in its terminal, or a launcher or scheduler passing one on): "
    "a stop from outside, not a failure; the traceback shows where the process was."
)

BY_KIND: dict[str, ErrorKind] = {k.kind: k for k in ERROR_KINDS}
FIXES: dict[str, str] = {k.kind: k.fix for k in ERROR_KINDS}
CRASH_PRIORITY: dict[str, int] = {
    k.kind: k.crash_priority
    for k in sorted(ERROR_KINDS, key=lambda k: k.crash_priority or 0)
    if k.crash_priority is not None
}


# The failures the cross-rank judgement weighs, one list for ``analyze``
# (detectors/crossrank.py) and the live agent (runtime/diagnose.py). A rank's own failure is a
# cause its peers' errors may follow (a GPU lost is one: only the live agent sees it).
OWN_FAILURES: tuple[str, ...] = ("crash", "oom", "cuda_error", "xid", "gpu_lost")
# What a rank says when another one failed: a collective that timed out or broke, a peer whose
# connection closed (gloo, the c10d store).
PEER_FAILURES: tuple[str, ...] = ("nccl_timeout", "nccl_error", "peer_error")
# What a live agent records in the run folder as a failure and holds until its peers' records
# are read: its own failures, and a lost peer it reports itself. The NCCL watchdog's texts are
# judged by the crash or stall they end in, which is recorded in their place.
RECORDED_FAILURES: frozenset[str] = frozenset({*OWN_FAILURES, "peer_error"})


_CAUSE_RE = re.compile(r"Cause \([^)]{1,40}\): (.{1,300})")
_NUMBERS_RE = re.compile(r"\d+")


def cause_text(message: str) -> str:
    """What a failure finding says the error was: its quoted cause (``Cause (crash): ...``),
    else its first sentence (``could not open the script ...``)."""
    m = _CAUSE_RE.search(message)
    return (m[1] if m else message.split(". ")[0]).strip().rstrip(".")[:300]


def same_cause(a: str, b: str) -> bool:
    """Two ranks' causes read the same but for their numbers (a rank, a device, a port, an
    address): one error common to the ranks, not one rank's failure that took the other down."""
    return bool(a) and _NUMBERS_RE.sub("#", a) == _NUMBERS_RE.sub("#", b)


# What a rank prints when a *peer* died: gloo, NCCL, c10d store and torchelastic texts.
PEER_FAILURE_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited|"
    r"ncclRemoteError|NCCL communicator was aborted|Watchdog caught collective operation timeout|"
    r"DistNetworkError|DistBackendError|Timed out waiting|Socket Timeout|RecvTimeout|"
    r"Failed to recv|SIGTERM from the launcher|failed \(exitcode|"
    # gloo's setup could not reach a peer's listener (torch 2.13: "Gloo connectFullMesh failed
    # with [...pair.cc:152] timed out connecting: SO_ERROR: Connection refused, remote=[...]"):
    # that peer is gone or never came, as on a restart over a store holding the last attempt's
    # addresses (every rank fails so; the s35b tester's d11).
    r"connectFullMesh failed",
    re.I,
)
