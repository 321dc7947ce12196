"""What the Xids a training job meets mean, and what to do about them.

Meanings follow NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors). Severity is
``warning`` where the application, not the GPU, is the usual culprit (or the event is
bookkeeping) and ``critical`` where the GPU needs a reset or the node a drain. The metric
label ``xid`` is bounded to these numbers plus ``other`` so a driver bug cannot blow up
the series count.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankwatch.records import Severity


@dataclass(frozen=True, slots=True)
class XidInfo:
    meaning: str
    action: str
    severity: Severity


_W, _C = Severity.WARNING, Severity.CRITICAL
_RESET = "reset the GPU (nvidia-smi -r) or reboot the node before reusing it"

XIDS: dict[int, XidInfo] = {
    13: XidInfo(
        "Graphics Engine Exception",
        "usually the application (out-of-bounds access, illegal instruction); rerun with "
        "CUDA_LAUNCH_BLOCKING=1 / compute-sanitizer; if it repeats on one GPU only, suspect hardware",
        _W,
    ),
    31: XidInfo(
        "GPU memory page fault",
        "usually an illegal memory access by the application (or a kernel bug); rarely the driver",
        _W,
    ),
    43: XidInfo(
        "GPU stopped processing",
        "the application's channel was stopped (often after a fault); the GPU itself stays healthy",
        _W,
    ),
    45: XidInfo(
        "Preemptive cleanup, due to previous errors",
        "the driver killed the remaining work after an earlier error or a process kill: look for the "
        "Xid before it",
        _W,
    ),
    48: XidInfo(
        "Double Bit ECC Error (DBE)",
        f"uncorrectable memory error: the job on this GPU is lost; {_RESET}; drain if it repeats",
        _C,
    ),
    61: XidInfo("Internal micro-controller breakpoint/warning", f"GPU firmware fault: {_RESET}", _C),
    62: XidInfo("Internal micro-controller halt", f"GPU firmware halted: {_RESET}", _C),
    63: XidInfo(
        "ECC page retirement or row remapping recording event",
        "a bad memory row was recorded for remapping; it takes effect at the next GPU reset",
        _W,
    ),
    64: XidInfo(
        "ECC page retirement or row remapper recording failure",
        "the GPU could not record a bad memory row: drain the node and reset; RMA if it repeats",
        _C,
    ),
    74: XidInfo(
        "NVLink Error",
        f"an NVLink connection failed: check `nvidia-smi nvlink -s` and NVSwitch/fabric manager; {_RESET}",
        _C,
    ),
    79: XidInfo(
        "GPU has fallen off the bus",
        "the GPU stopped answering on PCIe: drain and reboot the node; check power, cooling and the "
        "PCIe slot; RMA if it repeats",
        _C,
    ),
    92: XidInfo(
        "High single-bit ECC error rate",
        "many corrected memory errors: still working, but watch for an uncorrectable one; plan a reset",
        _W,
    ),
    94: XidInfo(
        "Contained ECC error",
        f"an uncorrectable memory error killed the processes using that memory; {_RESET} when drained",
        _C,
    ),
    95: XidInfo(
        "Uncontained ECC error",
        f"an uncorrectable memory error affected every process on this GPU; {_RESET} now",
        _C,
    ),
    119: XidInfo(
        "GSP RPC Timeout",
        f"the GPU System Processor firmware stopped answering; {_RESET}; update the driver if it recurs",
        _C,
    ),
    120: XidInfo(
        "GSP Error",
        f"the GPU System Processor firmware reported an error; {_RESET}; update the driver if it recurs",
        _C,
    ),
}

_OTHER = XidInfo(
    "an Xid not in rankwatch's table",
    "look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) and check dmesg",
    _W,
)


def xid_info(xid: int) -> XidInfo:
    return XIDS.get(xid, _OTHER)


def xid_label(xid: int) -> str:
    """The bounded metric label value: the number when known, else ``other``."""
    return str(xid) if xid in XIDS else "other"
