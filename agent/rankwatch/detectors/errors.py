"""Turns recognised error signatures into findings with the usual fix attached."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rankwatch.detectors.base import Detector, DetectorContext, finding
from rankwatch.detectors.registry import register
from rankwatch.events import Event
from rankwatch.records import ErrorRecord, Finding
from rankwatch.state import RankState

if TYPE_CHECKING:
    from rankwatch.config.schema import Config

FIXES = {
    "oom": "Usual fix: smaller micro-batch or sequence length, activation checkpointing, "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation, or more sharding (FSDP/ZeRO).",
    "nccl_timeout": "A collective waited past the NCCL timeout: usually one rank is stuck or died "
    "first; its log holds the real error. Check the rank that stopped first, not this one.",
    "nccl_error": "Usual causes: a peer rank died, a network/IB fault, or mismatched collectives. "
    "Set NCCL_DEBUG=INFO and check the first rank that failed.",
    "cuda_error": "Rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; device-side asserts are "
    "usually out-of-range indices (labels vs vocab size, embedding ids). Illegal memory access with "
    "repeated Xid means a hardware problem: drain the node.",
    "xid": "An NVIDIA driver Xid error: check `nvidia-smi -q` and the node's dmesg; "
    "Xid 79/48/63/64/74/92/94/95 usually mean the GPU needs a reset or the node must be drained.",
    "peer_error": "The collective backend (gloo) or the c10d store lost its connection to a peer: "
    "that peer died or exited first, and this rank's failure is its consequence. The peer's log "
    "holds the cause; `rankwatch analyze` over every rank's log names the rank that failed first.",
    "crash": "The rank ended abnormally: a traceback in the evidence names the failing frame; "
    "without one, the exit code or signal says how it was stopped.",
}

MAX_PER_KIND = 20


@register
class ErrorSignatureDetector(Detector):
    """One finding per distinct error; a flood of identical NCCL WARN lines becomes one."""

    kinds = tuple(FIXES)
    accepts = (ErrorRecord,)
    section = None  # every signature is reported; the catalogue decides what is one

    @classmethod
    def create(cls, cfg: Config, ctx: DetectorContext) -> ErrorSignatureDetector:
        return cls()

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.per_kind: dict[str, int] = {}

    def observe(self, state: RankState, record: Event) -> list[Finding]:
        if not isinstance(record, ErrorRecord):
            return []
        key = (record.kind, record.summary[:200])
        if key in self.seen or self.per_kind.get(record.kind, 0) >= MAX_PER_KIND:
            return []
        self.seen.add(key)
        self.per_kind[record.kind] = self.per_kind.get(record.kind, 0) + 1
        fix = FIXES.get(record.kind, "")
        where = f" (last step {state.last_step})" if state.last_step is not None else ""
        msg = f"{record.summary}{where}. {fix}".strip()
        ev = {"lines": record.evidence, **record.details}
        f = finding(
            record.kind, record.severity, state, msg, record=record, step=state.last_step, evidence=ev
        )
        return [f]
