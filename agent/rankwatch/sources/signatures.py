"""Recognise the error text that frameworks, launchers, drivers and schedulers print.

The wording matched here is the wording the tools really print (PyTorch's caching
allocator and ProcessGroupNCCL, NCCL's own ``NCCL WARN``, the NVIDIA kernel driver, Slurm's
``srun``/``slurmstepd``, torchelastic), old and new variants alike.

Errors span lines: a Python traceback is one event from ``Traceback (most recent call
last):`` through its final exception line, plus the lines Python and PyTorch append to
the message (the CUDA "kernel errors might be asynchronously reported" advice, NCCL's
``Last error:``, torchelastic's failure box, chained tracebacks). So a matcher is a small
state machine, one per (stream, rank): interleaved ranks must not share one. A finished
traceback is held back until the next line shows it is not continued; ``flush`` (end of
stream), ``release`` (stream went quiet) or ``expire`` (other ranks moved on) hand it out.

Most lines are not errors, so an idle matcher spends a handful of substring tests per
line; regexes run only on lines that contain a trigger word.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from rankwatch.errorkinds import BY_KIND, ERROR_KINDS
from rankwatch.records import ErrorRecord, Severity

__all__ = [
    "GATE_WORDS",
    "NOT_AN_ERROR",
    "SIGNATURES",
    "Hit",
    "Signature",
    "SignatureMatcher",
    "classify",
    "may_hold_signature",
]

_C = Severity.CRITICAL
_W = Severity.WARNING

_UNITS = {
    "bytes": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}  # fmt: skip
_SIZE = r"(\d+(?:\.\d+)?) ?(bytes|KiB|MiB|GiB|TiB|KB|MB|GB|TB|B)\b"

# --- GPU and host memory -------------------------------------------------------------
_GPU_OOM = re.compile(
    r"(?:CUDA|HIP) out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|RESOURCE_EXHAUSTED: Out of memory"
    # The driver API's own name (cuda.h), as XLA's cuMemAllocAsync allocator prints it.
    r"|CUDA_ERROR_OUT_OF_MEMORY"
)
_OOM_TRIED = re.compile(r"Tried to allocate " + _SIZE)
# Before torch 2.1: "(GPU 0; 79.15 GiB total capacity; 1.2 GiB already allocated; 6.00 MiB free; ..."
_OOM_OLD = re.compile(
    r"\(GPU (\d+); " + _SIZE + r" total capacity(?:; " + _SIZE + r" already allocated)?"
    r"(?:; " + _SIZE + " free)?"
)
# Since: "GPU 0 has a total capacity of 79.11 GiB of which 6.00 MiB is free." (some say "capacty")
_OOM_NEW = re.compile(r"GPU (\d+) has a total capaci?ty of " + _SIZE + r" of which " + _SIZE + r" is free")
_KERNEL_OOM = re.compile(r"[Oo]ut of memory: Killed process (\d+) \(([^)]*)\)")
_DL_KILLED = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) is killed by signal: Killed")
_SLURM_OOM = re.compile(
    r"Detected (\d+) oom[-_]kill events?(?:\(s\))?(?: in (?:StepId=|step )([\w.]+?)\.?(?=\s|$))?"
)

# --- NCCL ------------------------------------------------------------------------------
_NCCL_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
    r"(?:.*?Timeout\(ms\)=(\d+)\))?(?: ran for (\d+) milliseconds)?"
)
# "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress ..."
_NCCL_STUCK = re.compile(r"watchdog got stuck for (\d+) seconds")
_NCCL_WARN = re.compile(r"NCCL WARN (.*)")
_NCCL_ABORTED = re.compile(
    r"NCCL communicator was aborted on rank (\d+)\.?\s*"
    r"(?:Original reason for (?:failure|the abort|aborting) was:\s*(.*))?"
)
_NCCL_ERROR_IN = re.compile(r"NCCL error in: ([^,]+), (.*?)(?:, NCCL version (\S+))?\s*$")
_NCCL_ERROR = re.compile(r"NCCL [Ee]rror(?: (\d+))?: (.*)")
_NCCL_CODE = re.compile(
    r"\b(nccl(?:System|Internal|UnhandledCuda|Remote|InvalidUsage|InvalidArgument|InProgress)Error)\b:?\s*(.*)"
)

# --- gloo and the c10d store: a peer went away -------------------------------------------------
# "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [18.25.6.30]:30872",
# "... pair.cc:589] Read error [192.168.70.92]:25266: Connection reset by peer".
_PEER_LOST = re.compile(
    r"(Connection closed by peer|Connection reset by peer|Broken pipe)(?: \[([^\]]{1,64})\]:(\d{1,5}))?"
)
_PEER_ADDR = re.compile(r"\[([0-9A-Za-z.:-]{1,64})\]:(\d{1,5})")
_PEER_WHERE = ("gloo", "pair.cc", "TCPStore", "c10d", "ProcessGroup")

# --- frameworks that log the exception that ended the run on one line -----------------------
# OLMo: "CRITICAL [olmo.util:158, rank=0] Uncaught OLMoThreadError: generator thread data thread 3 failed".
_UNCAUGHT = re.compile(r"\bUncaught ([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): ?(.*)$")

# --- the rank a message names, for lines no launcher prefixed ------------------------------
# ProcessGroupNCCL's "[Rank 7] Watchdog caught ..." (the default group's rank, the global one;
# "[PG 1 Rank 3]" is a rank in a subgroup and is not used) and OLMo's "[olmo.util:158, rank=0]".
_MESSAGE_RANK = re.compile(
    r"\[Rank (\d{1,7})\]|[\[,] ?rank=(\d{1,7})\]"
    # Megatron: "Rank 3: found NaN in local grad norm ..." (param_and_grad_buffer.py) and its
    # rerun state machine's "Rank 2, node n01, device 2, iteration -1: Unexpected result nan".
    r"|\bRank (\d{1,7})(?::|, node )"
)
# torch.multiprocessing.spawn names the failed process by its index, which is the local rank
# the spawned function receives: "-- Process 1 terminated with the following error:",
# "ProcessExitedException: process 1 terminated with signal SIGKILL".
_SPAWN_PROCESS = re.compile(
    r"-- Process (\d{1,7}) terminated with the following error"
    r"|process (\d{1,7}) terminated with (?:signal|exit code)"
)


def message_rank(text: str) -> int | None:
    """The rank a log line names in its own text (not in a launcher prefix), if any."""
    if "ank" not in text:
        return None
    m = _MESSAGE_RANK.search(text)
    if m is None:
        return None
    return int(next(g for g in m.groups() if g is not None))


def spawn_process(text: str) -> int | None:
    """The process index torch.multiprocessing.spawn reports as failed, if ``text`` names one."""
    if "rocess" not in text:
        return None
    m = _SPAWN_PROCESS.search(text)
    return None if m is None else int(m[1] if m[1] is not None else m[2])


# --- training code that stops on a NaN itself ----------------------------------------------
# detectron2 (engine/train_loop.py, _write_metrics): "FloatingPointError: Loss became infinite
# or NaN at iteration=2137!" - the trainer's own iteration. Megatron (param_and_grad_buffer.py):
# "Rank 3: found NaN in local grad norm in backward pass before data-parallel communication
# collective" and, through its rerun state machine, "Unexpected result nan (message='found NaN
# in local grad norm ...')".
_NAN_AT_ITER = re.compile(r"Error: Loss became infinite or NaN at iteration=(\d{1,15})")
# Coqui/Mozilla TTS (tts/layers/losses.py): raise RuntimeError(f" [!] NaN loss with {key}.")
_NAN_LOSS_WITH = re.compile(r"Error: {0,4}\[!\] NaN loss with (\w{1,64})")
_NAN_GRAD_NORM = re.compile(r"Error: .{0,200}?found (NaN) in local grad norm")


def _nan_raised(t: str) -> Hit | None:
    m = _NAN_AT_ITER.search(t)
    if m is not None:
        step = int(m[1])
        return Hit(
            "nan_loss", _C, f"the trainer stopped: loss became infinite or NaN at iteration {step}",
            {"step": step}, ("nan_raised", step),
        )  # fmt: skip
    m = _NAN_LOSS_WITH.search(t)
    if m is not None:
        return Hit(
            "nan_loss",
            _C,
            f"the trainer stopped: NaN loss in {m[1]}",
            {"loss_term": m[1]},
            ("nan_with", m[1]),
        )
    m = _NAN_GRAD_NORM.search(t)
    if m is not None:
        rank = message_rank(t)
        where = f" on rank {rank}" if rank is not None else ""
        d: dict[str, Any] = {} if rank is None else {"said_rank": rank}
        return Hit(
            "nan_loss", _C,
            f"Megatron stopped: {m[1]} in the local grad norm{where} before the data-parallel reduction",
            d, ("nan_grad_norm", rank),
        )  # fmt: skip
    return None


# --- fp16 loss scale gone to nothing -----------------------------------------------------------
# k2/icefall (egs/*/ASR/zipformer/train.py): "Grad scale is small: 1.29e-26" (below 1e-5 it
# saves a bad-model checkpoint and raises "grad_scale is too small, exiting: ...").
_GRAD_SCALE_SMALL = re.compile(r"[Gg]rad[ _]scale is (?:too )?small(?:, exiting)?: ([-\w.+]+)")


def _grad_scale_small(t: str) -> Hit | None:
    m = _GRAD_SCALE_SMALL.search(t)
    if m is None:
        return None
    return Hit(
        "loss_scale_collapse", _W,
        f"fp16 grad scale collapsed to {m[1]}: every step overflows (inf/NaN gradients)",
        {"loss_scale": m[1]}, ("grad_scale_small",),
    )  # fmt: skip


# --- a peer's collective timed out --------------------------------------------------------------
# ProcessGroupNCCL (flight recorder): "Received a dump signal due to a collective timeout from
# rank 13 and we will try our best to dump the debug info." Every rank prints it about rank 13.
_DUMP_SIGNAL = re.compile(
    r"NCCL\.cpp:\d{1,6}\] .{0,200}?Received a dump signal due to a collective timeout from\s+rank (\d{1,7})"
)


def _dump_signal(t: str) -> Hit | None:
    m = _DUMP_SIGNAL.search(t)
    if m is None:
        return None
    rank = int(m[1])
    return Hit(
        "nccl_timeout", _C, f"rank {rank} timed out in a collective (its flight recorder dump was requested)",
        {"about_rank": rank}, ("dump_signal", rank),
    )  # fmt: skip


# --- a py-spy dump pasted into the log ------------------------------------------------------
# "Thread 1234 (active): \"MainThread\"", "Thread 0x7F2B1C (idle+gil): \"Thread-1\"" (py-spy dump;
# "Process 1234: python train.py" and "Python v3.10.12 (/usr/bin/python3)" head it). Stacks, not
# training records: noted, so that a log holding only a dump is not "nothing recognised".
_PYSPY_THREAD = re.compile(r"^Thread (?:0x[0-9A-Fa-f]{1,16}|\d{1,10}) \((?:active|idle)(?:\+gil)?\): \"")


def _pyspy(t: str) -> Hit | None:
    m = _PYSPY_THREAD.match(t.lstrip())
    if m is None:
        return None
    return Hit(
        "stack_dump", Severity.INFO, "a py-spy dump of the process's threads is in the log", {}, ("pyspy",)
    )


# --- CUDA and the driver ------------------------------------------------------------------
_CUDA_ERR = re.compile(
    r"CUDA error: (.+)|CUDA driver error: (.+)|(cudaError\w+)|(CUDNN_STATUS_\w+|CUBLAS_STATUS_\w+)"
    r"|(uncorrectable ECC error.*)|CUDA failure \d+: (.+)"
)
_XID = re.compile(
    r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)(?:, pid=([^,]*))?(?:, name=([^,]*))?(?:,\s*(.*))?"
)
# Xids that usually mean the application, not the GPU, misbehaved (or pure bookkeeping).
_XID_WARNING = frozenset({13, 31, 43, 45, 63, 64, 92})
# A kernel's assert: ".../IndexKernel.cu:92: operator(): block: [0,0,0], thread: [0,0,0]
# Assertion `...` failed." One line per failing GPU thread, so thousands per burst.
_DEVICE_ASSERT = re.compile(
    r"(\S+\.cuh?):(\d+): (.*?):? ?block: \[(\d+),(\d+),(\d+)\], thread: \[(\d+),(\d+),(\d+)\]"
    r" Assertion(?: [`'](.*)[`'])? failed"
)

# --- torchelastic ------------------------------------------------------------------------
# api.py: "failed (exitcode: 1) local_rank: 0 (pid: 1234) of binary: /usr/bin/python3"
# (``of fn: main (start_method: spawn)`` when the entrypoint is a function).
_ELASTIC_FAILED = re.compile(
    r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of (binary|fn): (\S+)"
)

# --- Slurm and the shell ----------------------------------------------------------------
_SRUN = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+?)\s*$")
_SRUN_EXIT = re.compile(r"Exited with exit code (\d+)")
_SLURM_CANCEL = re.compile(
    r"\*\*\* (JOB|STEP) (\S+) (?:ON (\S+) )?CANCELLED AT (\S+)"
    r"(?: DUE TO ([A-Z][A-Z ]*?))?(?: [Oo][Nn] (\S+))? \*\*\*"
)
_CANCEL_REASONS = {
    "TIME LIMIT": ("time_limit", _C, "the time limit was reached"),
    "PREEMPTION": ("preemption", _C, "it was preempted"),
    "NODE FAILURE": ("node_failure", _C, "a node failed"),
    "JOB REQUEUE": ("requeue", _W, "it was requeued"),
}
_SIGNALS = {
    "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Aborted": "SIGABRT",
    "Illegal instruction": "SIGILL", "Floating point exception": "SIGFPE", "Killed": "SIGKILL",
}  # fmt: skip
_SIG_NAMES = r"(Segmentation fault|Bus error|Aborted|Illegal instruction|Floating point exception|Killed)"
# bash reporting a dead child: "script.sh: line 28:  8156 Killed   python train.py", or bare "Killed".
_SHELL_SIGNAL = re.compile(
    r"(?:\S*:? ?line \d+: +\d+ " + _SIG_NAMES + r"(?: +\(core dumped\))?(?: +\S.*)?"
    r"|" + _SIG_NAMES + r"(?: +\(core dumped\))?)\s*$"
)
_WHAT = re.compile(r"\s*(?:what\(\):\s+)+(.*)")

# --- Python tracebacks ----------------------------------------------------------------
_TB_HEAD = "Traceback (most recent call last)"
_EXC_LINE = re.compile(r"([A-Za-z_][\w.]*)(?::\s?(.*))?$")
_EXC_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit", "Iteration", "Warning", "Failure", "Fault")
_FRAME = re.compile(r'File "([^"]+)", line (\d+)(?:, in (.+))?')
_RICH_FRAME = re.compile(r"[│|] (\S+\.py):(\d+) in (\S+)")  # rich.traceback's boxed frames
_RICH_BOX = frozenset("│╭╰|")
_LIBRARY_PATH = ("site-packages", "dist-packages", "/lib/python", "<frozen", "/bin/", "\\lib\\")
_CHAIN_HEADS = (
    "During handling of the above exception",
    "The above exception was the direct cause",
    # torch.multiprocessing.spawn: the parent's ProcessRaisedException, then the child's own
    # traceback under "-- Process 1 terminated with the following error:". One event.
    "-- Process ",
)
# Lines that extend the message of the error just seen rather than start a new one.
_CONT = re.compile(
    r"\s*(?:CUDA kernel errors might be|For debugging consider passing|Compile with .?TORCH_USE_CUDA_DSA"
    r"|Device-side assertions? w|nccl[A-Z]\w*Error\b|Last error:|Exception raised from |frame #\d+:"
    r"|Search for .cuda|(?:Current thread|Thread) 0x[0-9a-fA-F]+|File \"|If reserved but unallocated"
    r"|See documentation for Memory Management|Including non-PyTorch memory|Of the allocated memory)"
)
_BOX_FIELD = re.compile(r"(time|host|rank|exitcode|error_file|traceback)\s*:\s*(.*)")
_BOX_RANK = re.compile(r"(\d+)(?: \(local_rank: (\d+)\))?")
_BOX_EXIT = re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?")
_BOX_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\)")

_KILLED = "killed (SIGKILL: the kernel OOM killer, scancel or a time limit)"
_SIGNUMS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}  # fmt: skip

_IDLE, _TB, _TAIL, _CHAIN, _BOX, _LEAD = range(6)
_DEDUP_LINES = 1000  # the same condition re-reported within this many lines is one event
_ATTACH_LINES = 20  # continuation lines this close to a one-line error join its evidence
_OOM_KILL_NEAR = 50  # a "Killed" this soon after an OOM-kill line was that OOM kill
_TAIL_LINES = 200  # a finished traceback waits at most this many stream lines for more
_MAX_NOISE = 50  # stray lines inside a traceback before giving up on its final line
_MAX_TB_LINES = 20000
_MAX_SUMMARY = 500


class Hit(NamedTuple):
    """What one line says: ``key`` names the event so its repetitions can be folded."""

    kind: str
    severity: Severity
    summary: str
    details: dict[str, Any]
    key: tuple[Any, ...] | None = None


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNITS[unit])


def _short(text: str) -> str:
    s = text.strip()
    return s if len(s) <= _MAX_SUMMARY else s[: _MAX_SUMMARY - 3] + "..."


def _gpu_oom(t: str) -> Hit:
    d: dict[str, Any] = {}
    m = _OOM_TRIED.search(t)
    if m:
        d["tried_bytes"] = _bytes(m[1], m[2])
    m = _OOM_NEW.search(t)
    if m:
        d["gpu"] = int(m[1])
        d["total_bytes"] = _bytes(m[2], m[3])
        d["free_bytes"] = _bytes(m[4], m[5])
    else:
        m = _OOM_OLD.search(t)
        if m:
            d["gpu"] = int(m[1])
            d["total_bytes"] = _bytes(m[2], m[3])
            if m[4]:
                d["allocated_bytes"] = _bytes(m[4], m[5])
            if m[6]:
                d["free_bytes"] = _bytes(m[6], m[7])
    # The traceback and a framework's own one-line report of it (OLMo's "Uncaught
    # OutOfMemoryError: ...") tell one event: the same request on the same GPU.
    key = ("gpu_oom", d.get("tried_bytes"), d.get("gpu")) if "tried_bytes" in d else None
    return Hit("oom", _C, _short(t), d, key)


def _host_oom(summary: str, **details: Any) -> Hit:
    return Hit("oom", _C, summary, {"host": True, **details})


def _srun(t: str) -> Hit | None:
    m = _SRUN.search(t)
    if m is None:
        return None
    node, tasks, status = m[1], m[2], m[3]
    first = re.match(r"\d+", tasks)
    d: dict[str, Any] = {"node": node, "tasks": tasks, "task": int(first[0]) if first else None}
    if status.startswith("Out Of Memory"):
        return _host_oom(f"srun: task {tasks} on {node} ran out of host memory", **d)
    e = _SRUN_EXIT.search(status)
    if e:
        d["exit_code"] = int(e[1])
        return Hit("crash", _C, f"srun: task {tasks} on {node} exited with exit code {e[1]}", d)
    if status.startswith("Killed"):
        d["killed"] = True
        d["signal"] = "SIGKILL"
        return Hit("crash", _C, f"srun: task {tasks} on {node} was killed (SIGKILL)", d)
    d["status"] = status
    sig = _SIGNALS.get(status.split(" (")[0])
    if sig:
        d["signal"] = sig
    # srun terminates the surviving tasks once one has failed: a consequence, not a cause.
    sev = _W if status.startswith("Terminated") else _C
    return Hit("crash", sev, f"srun: task {tasks} on {node}: {status}", d)


def _slurm_oom(t: str) -> Hit | None:
    if "slurmstepd" not in t:
        return None
    m = _SLURM_OOM.search(t)
    if m is None:
        return None
    step = m[2]
    d: dict[str, Any] = {"events": int(m[1])}
    if step:
        d["step"] = step
    return Hit("oom", _C, _short(t), {"host": True, **d}, ("slurm_oom", step))


def _slurm_cancel(t: str) -> Hit | None:
    if "slurmstepd" not in t:
        return None
    m = _SLURM_CANCEL.search(t)
    if m is None:
        return None
    what, ident, node, at, due = m[1], m[2], m[3] or m[6], m[4], m[5]
    reason, sev, why = _CANCEL_REASONS.get(due or "", (None, _W, None))
    if reason is None:
        reason = due.strip().lower().replace(" ", "_") if due else "cancelled"
        why = f"due to {due.strip().lower()}" if due else "it was cancelled"
    where = f" on {node}" if node else ""
    d: dict[str, Any] = {"reason": reason, "scope": what.lower(), "id": ident, "at": at}
    if node:
        d["node"] = node
    summary = f"Slurm {what.lower()} {ident}{where} was cancelled at {at}: {why}"
    return Hit("crash", sev, summary, d, ("slurm_cancel", ident.split(".")[0], reason))


def _gpu_oom_rule(t: str) -> Hit | None:
    return _gpu_oom(t) if _GPU_OOM.search(t) else None


def _kernel_oom(t: str) -> Hit | None:
    m = _KERNEL_OOM.search(t)
    return _host_oom(_short(t), pid=int(m[1]), process=m[2]) if m else None


def _memory_error(t: str) -> Hit | None:
    if t.lstrip().startswith(("MemoryError", "builtins.MemoryError")):
        return _host_oom(_short(t))
    return None


def _dataloader_killed(t: str) -> Hit | None:
    m = _DL_KILLED.search(t)
    return _host_oom(_short(t), dataloader=True, pids=m[1].strip()) if m else None


def _nccl_warn(t: str) -> Hit | None:
    m = _NCCL_WARN.search(t)
    if m is None:
        return None
    msg = m[1].strip()
    norm = re.sub(r"0x[0-9a-fA-F]+|\d+", "#", msg)[:160]
    return Hit("nccl_error", _W, _short(t), {"warn": msg}, ("nccl_warn", norm))


def _nccl_timeout(t: str) -> Hit | None:
    m = _NCCL_TIMEOUT.search(t)
    if m:
        d: dict[str, Any] = {"seq_num": int(m[1]), "op_type": m[2]}
        if m[3]:
            d["timeout_ms"] = int(m[3])
        if m[4]:
            d["ran_for_ms"] = int(m[4])
        return Hit("nccl_timeout", _C, _short(t), d, ("nccl_timeout", d["seq_num"], m[2]))
    return None


def _nccl_timeout_text(t: str) -> Hit | None:
    """The watchdog's words without the WorkNCCL(...) the full rule reads."""
    return Hit("nccl_timeout", _C, _short(t), {}, ("nccl_timeout", None, None))


def _nccl_stuck(t: str) -> Hit | None:
    m = _NCCL_STUCK.search(t)
    if m is None:
        return None
    return Hit("nccl_timeout", _C, _short(t), {"watchdog_stuck_s": int(m[1])}, ("nccl_stuck",))


# The NCCL watchdog reporting a CUDA fault ("CUDA error: an illegal memory access ..."): the
# CUDA rule names it better, so the NCCL error rules below leave such a line to it.


def _nccl_aborted(t: str) -> Hit | None:
    m = None if "CUDA error:" in t else _NCCL_ABORTED.search(t)
    if m is None:
        return None
    d: dict[str, Any] = {"aborted_rank": int(m[1])}
    if m[2]:
        d["reason"] = m[2].strip()
    return Hit("nccl_error", _C, _short(t), d)


def _nccl_error_in(t: str) -> Hit | None:
    m = None if "CUDA error:" in t else _NCCL_ERROR_IN.search(t)
    if m is None:
        return None
    d: dict[str, Any] = {"where": m[1].strip(), "error": m[2].strip()}
    if m[3]:
        d["nccl_version"] = m[3]
    return Hit("nccl_error", _C, _short(t), d)


def _nccl_error(t: str) -> Hit | None:
    m = None if "CUDA error:" in t else _NCCL_ERROR.search(t)
    if m is None:
        return None
    d: dict[str, Any] = {"error": m[2].strip()}
    if m[1]:
        d["code"] = int(m[1])
    return Hit("nccl_error", _C, _short(t), d)


def _nccl_code(t: str) -> Hit | None:
    m = None if "CUDA error:" in t else _NCCL_CODE.search(t)
    if m is None:
        return None
    return Hit("nccl_error", _C, _short(t), {"code": m[1], "error": m[2].strip()})


def _cuda(t: str) -> Hit | None:
    m = _CUDA_ERR.search(t)
    if m is None:
        return None
    err = next(g for g in m.groups() if g).strip()
    d: dict[str, Any] = {"error": err}
    if "ECC" in err:
        d["ecc"] = True
    if "device-side assert" in err:
        d["device_assert"] = True
    return Hit("cuda_error", _C, _short(t), d)


def _xid(t: str) -> Hit | None:
    m = _XID.search(t)
    if m:
        xid = int(m[2])
        d: dict[str, Any] = {"xid": xid, "pci": m[1]}
        if m[3] and m[3].strip("'<>") not in ("", "unknown"):
            d["pid"] = m[3].strip("'")
        if m[4]:
            d["process"] = m[4].strip()
        if m[5]:
            d["message"] = m[5].strip()
        sev = _W if xid in _XID_WARNING else _C
        return Hit("xid", sev, _short(t), d, ("xid", m[1], xid))
    if "fallen off the bus" in t:
        return Hit("xid", _C, _short(t), {"xid": 79, "pci": None}, ("xid", None, 79))
    return None


def _device_assert(t: str) -> Hit | None:
    m = _DEVICE_ASSERT.search(t)
    if m is None:
        return None
    where = f"{m[1].rsplit('/', 1)[-1]}:{m[2]}"
    d: dict[str, Any] = {
        "error": "device-side assert triggered", "device_assert": True, "kernel": m[3].strip(),
        "where": f"{m[1]}:{m[2]}", "block": [int(m[4]), int(m[5]), int(m[6])],
        "thread": [int(m[7]), int(m[8]), int(m[9])],
    }  # fmt: skip
    what = "assertion failed"
    if m[10] is not None:
        d["assertion"] = m[10]
        what = f"`{m[10]}` failed"
    summary = _short(f"CUDA device-side assert in {where} ({d['kernel']}): {what}")
    # One line per failing GPU thread: the whole burst is one event.
    return Hit("cuda_error", _C, summary, d, ("device_assert",))


def _elastic_failed(t: str) -> Hit | None:
    m = _ELASTIC_FAILED.search(t)
    if m is None:
        return None
    code, local_rank, pid = int(m[1]), int(m[2]), int(m[3])
    # Named as in torchelastic's failure box, which tells the same event when it follows.
    d: dict[str, Any] = {"exitcode": code, "local_rank": local_rank, "pid": pid, m[4]: m[5], "lead": True}
    # The launcher prints this about a child: the child's rank, not the launcher's. The local
    # rank is the one it names (the box that may follow names the global rank and replaces it).
    d["failed_rank"] = local_rank
    how = f"exitcode {code}"
    if code < 0:
        sig = _SIGNUMS.get(-code, f"signal {-code}")
        d["signal"] = sig
        how += f" ({sig})"
    summary = f"torchelastic: local_rank {local_rank} (pid {pid}) failed with {how}"
    return Hit("crash", _C, summary, d, ("elastic_failed", local_rank, pid))


# The DeepSpeed launcher (deepspeed/launcher/launch.py, sigkill_handler) names the child by its
# command line: "[ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py',
# '--local_rank=0', ...] exits with return code = -9".
_DS_LAUNCHER_EXIT = re.compile(r"exits with return code = (-?\d{1,4})")
_DS_LOCAL_RANK = re.compile(r"'--local_rank=(\d{1,7})'")


def _ds_launcher_exit(t: str) -> Hit | None:
    m = _DS_LAUNCHER_EXIT.search(t)
    if m is None:
        return None
    code = int(m[1])
    d: dict[str, Any] = {"exitcode": code}
    how = f"return code {code}"
    if code < 0:
        d["signal"] = _SIGNUMS.get(-code, f"signal {-code}")
        how += f" ({d['signal']})"
    r = _DS_LOCAL_RANK.search(t)
    who = "a child"
    if r is not None:
        d["failed_rank"] = d["local_rank"] = int(r[1])
        who = f"local_rank {r[1]}"
    if code == -9:
        how += " - SIGKILL usually means the host OOM killer"
    key = ("ds_launcher", r[1] if r else None)
    return Hit("crash", _C, f"DeepSpeed launcher: {who} exited with {how}", d, key)


# torch.distributed.launch (before torchrun) raises CalledProcessError naming the child by its
# command line; CPython's subprocess words a child killed by a signal "Command '...' died with
# <Signals.SIGSEGV: 11>." (CalledProcessError.__str__).
_LAUNCH_DIED = re.compile(r"died with <Signals\.(SIG[A-Z0-9]{2,8}): (\d{1,3})>")


def _launch_died(t: str) -> Hit | None:
    m = _LAUNCH_DIED.search(t)
    if m is None or "CalledProcessError" not in t:
        return None
    d: dict[str, Any] = {"signal": m[1], "exitcode": -int(m[2])}
    r = _DS_LOCAL_RANK.search(t)
    who = "a child"
    if r is not None:
        d["failed_rank"] = d["local_rank"] = int(r[1])
        who = f"local_rank {r[1]}"
    key = ("launch_died", r[1] if r else None)
    return Hit("crash", _C, f"torch.distributed.launch: {who} died with {m[1]}", d, key)


def _peer(t: str) -> Hit | None:
    """A collective backend (gloo) or the c10d store lost the connection to a peer: the peer
    died or exited first, so this rank's failure is a consequence and the peer's log holds
    the cause. Not a crash of its own: a warning that points at the peer."""
    m = _PEER_LOST.search(t)
    if m is None or not any(w in t for w in _PEER_WHERE):
        return None
    d: dict[str, Any] = {"error": m[1]}
    a = _PEER_ADDR.search(t)
    if a is not None:
        d["peer"] = f"{a[1]}:{a[2]}"
    who = f"peer {d['peer']}" if "peer" in d else "a peer"
    summary = _short(f"lost the connection to {who} ({m[1]}): {t.strip()}")
    return Hit("peer_error", _W, summary, d, ("peer_error", d.get("peer")))


def _uncaught(t: str) -> Hit | None:
    m = _UNCAUGHT.search(t)
    if m is None:
        return None
    return Hit("crash", _C, _short(f"{m[1]}: {m[2]}"), {"exception": m[1], "message": m[2].strip()})


def _cpp_terminate(t: str) -> Hit | None:
    m = _WHAT.match(t)
    if m is None:
        return None
    msg = m[1]
    inner = classify(msg)
    if inner is not None:
        return inner
    if "bad_alloc" in msg:
        return _host_oom(_short(t), cpp_exception="std::bad_alloc")
    return Hit("crash", _C, _short("terminate called: " + msg), {"cpp_exception": msg.strip()})


def _fatal_python(t: str) -> Hit | None:
    s = t.strip()
    if not s.startswith("Fatal Python error:"):
        return None
    msg = s[len("Fatal Python error:") :].strip()
    d: dict[str, Any] = {"fatal": msg}
    sig = _SIGNALS.get(msg.split(":")[0].strip())
    if sig:
        d["signal"] = sig
    return Hit("crash", _C, _short(s), d)


def _shell_signal(t: str) -> Hit | None:
    s = t.strip()
    m = _SHELL_SIGNAL.match(s)
    if m is None:
        return None
    sig = _SIGNALS[m[1] or m[2]]
    if sig == "SIGKILL":
        # Who sent it is not on this line; SignatureMatcher makes it an OOM when an
        # OOM-kill line came just before.
        summary = _KILLED if s == "Killed" else f"{s}: {_KILLED}"
        return Hit("crash", _C, _short(summary), {"signal": "SIGKILL", "killed": True, "shell": True})
    return Hit("crash", _C, _short(s), {"signal": sig})


# --- the catalogue -------------------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    """One error signature: which lines it may match, and the rule that reads them.

    ``triggers``: a line this signature matches contains one of these words; the fast gate
    (``may_hold_signature``) is built from the triggers of all signatures, so a signature
    cannot be shut out by a word missing from it. Every match of each of ``patterns`` (the
    regexes that decide a match) contains a trigger (tests/test_catalogs.py proves it), and a
    plain substring test inside ``rule`` runs only on lines the triggers admitted. Short word
    fragments ("rror", "emory") shared by several signatures keep the gate to a few tests.

    ``context``: the line must also contain one of these (not part of the gate). ``unless``:
    never a line that contains one of these. ``kinds``: the kinds its hits report (the first is
    the usual one; each is a row of ``rankwatch.errorkinds``, which holds the fix and the crash
    priority). ``severity``: the highest severity it reports. ``example``: a real line it
    matches (tests/test_catalogs.py checks that this signature, not an earlier one, takes it).
    """

    name: str
    kinds: tuple[str, ...]
    severity: Severity
    triggers: tuple[str, ...]
    rule: Callable[[str], Hit | None]
    patterns: tuple[re.Pattern[str], ...] = ()
    context: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()
    example: str = ""

    def __post_init__(self) -> None:
        if not self.triggers or not all(self.triggers):
            raise ValueError(f"signature {self.name!r} needs at least one non-empty trigger word")
        if not self.kinds:
            raise ValueError(f"signature {self.name!r} names no kind")
        unknown = [k for k in self.kinds if k not in BY_KIND]
        if unknown:
            raise ValueError(f"signature {self.name!r}: kinds {unknown} are not in rankwatch.errorkinds")

    @property
    def kind(self) -> str:
        return self.kinds[0]

    def admits(self, t: str) -> bool:
        """The line passes this signature's word tests (its rule may still find nothing)."""
        return (
            any(w in t for w in self.triggers)
            and (not self.context or any(w in t for w in self.context))
            and not any(w in t for w in self.unless)
        )


_NCCL_WORDS = ("NCCL", "nccl")  # ProcessGroupNCCL, WorkNCCL, "nccl" in backend names
_ALL_KINDS = tuple(k.kind for k in ERROR_KINDS)

# Most to least specific: the first signature whose rule finds something names the line (an
# OOM reported through NCCL is an OOM, a CUDA fault the NCCL watchdog tripped over is a CUDA
# error).
SIGNATURES: tuple[Signature, ...] = (
    Signature(
        name="srun_task",
        kinds=("crash", "oom"),
        severity=_C,
        triggers=("srun: error:",),
        rule=_srun,
        patterns=(_SRUN,),
        example="srun: error: node01: task 3: Exited with exit code 1",
    ),
    Signature(
        name="slurm_oom_kill",
        kinds=("oom",),
        severity=_C,
        triggers=("kill event",),
        rule=_slurm_oom,
        patterns=(_SLURM_OOM,),
        context=("slurmstepd",),
        example="slurmstepd: error: Detected 2 oom-kill event(s) in step 3495064.batch cgroup.",
    ),
    Signature(
        name="slurm_cancel",
        kinds=("crash",),
        severity=_C,
        triggers=("CANCELLED",),
        rule=_slurm_cancel,
        patterns=(_SLURM_CANCEL,),
        context=("slurmstepd",),
        example="slurmstepd: error: *** JOB 1234 ON node01 CANCELLED AT 2024-05-01T10:00:00 "
        "DUE TO TIME LIMIT ***",
    ),
    Signature(
        name="gpu_oom",
        kinds=("oom",),
        severity=_C,
        triggers=("emory", "_STATUS_", "_OUT_OF_MEMORY"),
        rule=_gpu_oom_rule,
        patterns=(_GPU_OOM,),
        example="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
    ),
    Signature(
        name="kernel_oom_kill",
        kinds=("oom",),
        severity=_C,
        triggers=("emory",),
        rule=_kernel_oom,
        patterns=(_KERNEL_OOM,),
        example="[12345.678] Out of memory: Killed process 4242 (python)",
    ),
    Signature(
        name="memory_error",
        kinds=("oom",),
        severity=_C,
        triggers=("MemoryError",),
        rule=_memory_error,
        example="MemoryError",
    ),
    Signature(
        name="peer_lost",
        kinds=("peer_error",),
        severity=_W,
        triggers=("by peer", "Broken pipe"),
        rule=_peer,
        patterns=(_PEER_LOST,),
        context=_PEER_WHERE,
        unless=("NCCL",),  # NCCL's own words say more
        example="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
        "Connection closed by peer [18.25.6.30]:30872",
    ),
    Signature(
        name="dataloader_killed",
        kinds=("oom",),
        severity=_C,
        triggers=("illed",),
        rule=_dataloader_killed,
        patterns=(_DL_KILLED,),
        example="RuntimeError: DataLoader worker (pid 12345) is killed by signal: Killed.",
    ),
    Signature(
        name="nccl_warn",
        kinds=("nccl_error",),
        severity=_W,
        triggers=("NCCL",),
        rule=_nccl_warn,
        patterns=(_NCCL_WARN,),
        example="kp-ddp-worker-0:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer",
    ),
    Signature(
        name="nccl_timeout",
        kinds=("nccl_timeout",),
        severity=_C,
        triggers=("NCCL",),
        rule=_nccl_timeout,
        patterns=(_NCCL_TIMEOUT,),
        example="[E ProcessGroupNCCL.cpp:737] [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600027 milliseconds "
        "before timing out.",
    ),
    Signature(
        name="nccl_timeout_text",
        kinds=("nccl_timeout",),
        severity=_C,
        triggers=("collective operation timeout",),
        rule=_nccl_timeout_text,
        context=_NCCL_WORDS,
        # Older torch named no sequence number: "WorkNCCL(OpType=ALLREDUCE, Timeout(ms)=...)".
        example="Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE, "
        "Timeout(ms)=1800000) ran for 1800995 milliseconds before timing out.",
    ),
    Signature(
        name="nccl_watchdog_stuck",
        kinds=("nccl_timeout",),
        severity=_C,
        triggers=("watchdog got stuck",),
        context=_NCCL_WORDS,
        rule=_nccl_stuck,
        patterns=(_NCCL_STUCK,),
        example="ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress in "
        "monitoring enqueued collectives.",
    ),
    Signature(
        name="nccl_aborted",
        kinds=("nccl_error",),
        severity=_C,
        triggers=("NCCL",),
        rule=_nccl_aborted,
        patterns=(_NCCL_ABORTED,),
        unless=("CUDA error:",),
        example="torch.distributed.DistBackendError: NCCL communicator was aborted on rank 2. ",
    ),
    Signature(
        name="nccl_error_in",
        kinds=("nccl_error",),
        severity=_C,
        triggers=("NCCL",),
        rule=_nccl_error_in,
        patterns=(_NCCL_ERROR_IN,),
        unless=("CUDA error:",),
        example="RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, "
        "unhandled system error, NCCL version 2.7.8",
    ),
    Signature(
        name="nccl_error",
        kinds=("nccl_error",),
        severity=_C,
        triggers=("NCCL",),
        rule=_nccl_error,
        patterns=(_NCCL_ERROR,),
        unless=("CUDA error:",),
        example="NCCL error: unhandled system error",
    ),
    Signature(
        name="nccl_code",
        kinds=("nccl_error",),
        severity=_C,
        triggers=("rror",),
        rule=_nccl_code,
        patterns=(_NCCL_CODE,),
        unless=("CUDA error:",),
        example="ncclInternalError: Internal check failed.",
    ),
    Signature(
        name="cuda_error",
        kinds=("cuda_error",),
        severity=_C,
        triggers=("rror", "_STATUS_", "CUDA failure"),
        rule=_cuda,
        patterns=(_CUDA_ERR,),
        example="RuntimeError: CUDA error: an illegal memory access was encountered",
    ),
    Signature(
        name="xid",
        kinds=("xid",),
        severity=_C,
        triggers=("NVRM",),
        rule=_xid,
        patterns=(_XID,),
        example="[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus.",
    ),
    Signature(
        name="device_assert",
        kinds=("cuda_error",),
        severity=_C,
        triggers=("ssertion",),
        rule=_device_assert,
        patterns=(_DEVICE_ASSERT,),
        example="/pytorch/aten/src/ATen/native/cuda/Loss.cu:240: nll_loss_forward_reduce_cuda_kernel_2d: "
        "block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.",
    ),
    Signature(
        name="nccl_dump_signal",
        kinds=("nccl_timeout",),
        severity=_C,
        triggers=("NCCL",),
        context=("Received a dump signal",),
        rule=_dump_signal,
        patterns=(_DUMP_SIGNAL,),
        example="[rank0]:[E804 23:05:54.817424543 ProcessGroupNCCL.cpp:1914] [PG ID 0 PG GUID 0(default_pg) "
        "Rank 0] Received a dump signal due to a collective timeout from  rank 13 and we will try our best",
    ),
    Signature(
        name="grad_scale_small",
        kinds=("loss_scale_collapse",),
        severity=_W,
        triggers=("cale is",),
        rule=_grad_scale_small,
        patterns=(_GRAD_SCALE_SMALL,),
        example="2024-01-14 01:03:00,826 WARNING [train.py:1057] (2/4) Grad scale is small: "
        "1.2924697071141057e-26",
    ),
    Signature(
        name="pyspy_dump",
        kinds=("stack_dump",),
        severity=Severity.INFO,
        triggers=('): "',),
        rule=_pyspy,
        patterns=(_PYSPY_THREAD,),
        example='Thread 3771 (active): "MainThread"',
    ),
    Signature(
        name="nan_raised",
        kinds=("nan_loss",),
        severity=_C,
        triggers=("rror",),  # the exception's name: "FloatingPointError: Loss became ..."
        rule=_nan_raised,
        patterns=(_NAN_AT_ITER, _NAN_GRAD_NORM, _NAN_LOSS_WITH),
        example="FloatingPointError: Loss became infinite or NaN at iteration=2137!",
    ),
    Signature(
        name="elastic_failed",
        kinds=("crash",),
        severity=_C,
        triggers=("xitcode",),
        rule=_elastic_failed,
        patterns=(_ELASTIC_FAILED,),
        example="E0101 12:00:00.123000 140 torch/distributed/elastic/multiprocessing/api.py:869] failed "
        "(exitcode: 1) local_rank: 0 (pid: 1234) of binary: /usr/bin/python3",
    ),
    Signature(
        name="ds_launcher_exit",
        kinds=("crash",),
        severity=_C,
        triggers=("xit",),
        context=("exits with return code",),
        rule=_ds_launcher_exit,
        patterns=(_DS_LAUNCHER_EXIT,),
        example="[2023-11-28 10:00:34,590] [ERROR] [launch.py:321:sigkill_handler] ['/home/.python_libs/"
        "conda_env/deepseek/bin/python', '-u', 'finetune_deepseekcoder.py', '--local_rank=0'] exits with "
        "return code = -9",
    ),
    Signature(
        name="launch_died",
        kinds=("crash",),
        severity=_C,
        triggers=("died with <Signals.",),
        rule=_launch_died,
        patterns=(_LAUNCH_DIED,),
        example="subprocess.CalledProcessError: Command '['/usr/bin/python3', '-u', 'train.py', "
        "'--local_rank=7']' died with <Signals.SIGSEGV: 11>.",
    ),
    Signature(
        name="uncaught",
        kinds=("crash",),
        severity=_C,
        triggers=("Uncaught ",),
        rule=_uncaught,
        patterns=(_UNCAUGHT,),
        example="CRITICAL [olmo.util:158, rank=0] Uncaught OLMoThreadError: generator thread data "
        "thread 3 failed",
    ),
    Signature(
        name="cpp_terminate",
        kinds=("crash", *(k for k in _ALL_KINDS if k != "crash")),  # the message inside may be any
        severity=_C,
        triggers=("what()",),
        rule=_cpp_terminate,
        patterns=(_WHAT,),
        example="  what():  std::bad_alloc",
    ),
    Signature(
        name="fatal_python",
        kinds=("crash",),
        severity=_C,
        triggers=("Fatal Python error:",),
        rule=_fatal_python,
        example="Fatal Python error: Segmentation fault",
    ),
    Signature(
        name="shell_signal",
        kinds=("crash",),
        severity=_C,
        triggers=("fault", "rror", "Aborted", "nstruction", "xception", "illed"),
        rule=_shell_signal,
        patterns=(_SHELL_SIGNAL,),
        example="Segmentation fault (core dumped)",
    ),
)

# NCCL_DEBUG=INFO chatter names the errors NCCL recovered from ("... -> 6 ncclRemoteError"): a
# line holding this is never an error, whatever else it says.
NOT_AN_ERROR = "NCCL INFO"

# SignatureMatcher itself starts a torchelastic failure box on these words (the box may come
# alone, without the ChildFailedError traceback above it: hallo2#75).
_BOX_ROOT = "Root Cause (first observed failure)"
_MATCHER_TRIGGERS = ("ChildFailedError", _BOX_ROOT)


def gate_words(signatures: tuple[Signature, ...] = SIGNATURES) -> tuple[str, ...]:
    """The fewest words that every trigger contains one of (a trigger holding another is left
    to it), shortest first: the common short words come first, so a line holding one stops early."""
    words = list(dict.fromkeys([*(w for s in signatures for w in s.triggers), *_MATCHER_TRIGGERS]))
    kept = [w for w in words if not any(v != w and v in w for v in words)]
    return tuple(sorted(kept, key=len))


def _make_gate(words: tuple[str, ...]) -> Callable[[str], bool]:
    # One chain of ``in`` tests, as a hand-written gate would be: the gate runs on every line.
    src = "def may_hold_signature(t):\n    return " + " or ".join(f"{w!r} in t" for w in words) + "\n"
    ns: dict[str, Any] = {}
    exec(compile(src, f"<gate of {__name__}>", "exec"), ns)
    gate: Callable[[str], bool] = ns["may_hold_signature"]
    gate.__doc__ = (
        "Cheap gate: True when the text holds a trigger word of some signature (a text without "
        "any of them, however long, cannot match one)."
    )
    return gate


GATE_WORDS = gate_words()
may_hold_signature = _make_gate(GATE_WORDS)
_RULES = tuple((s.triggers, s.context, s.unless, s.rule) for s in SIGNATURES)


def classify(line: str) -> Hit | None:
    """The error a single (decoration-free) line reports, if any: the first signature (in
    ``SIGNATURES`` order) whose words admit the line and whose rule finds something."""
    t = line
    if NOT_AN_ERROR in t or not may_hold_signature(t):
        return None
    for triggers, context, unless, rule in _RULES:
        for w in triggers:
            if w in t:
                break
        else:
            continue
        if context and not any(w in t for w in context):
            continue
        if unless and any(w in t for w in unless):
            continue
        hit = rule(t)
        if hit is not None:
            return hit
    return None


def _is_exception_line(stripped: str) -> re.Match[str] | None:
    m = _EXC_LINE.match(stripped)
    if m is None:
        return None
    name = m[1]
    if name.endswith(_EXC_SUFFIXES) or (m[2] is not None and ("." in name or name[:1].isupper())):
        return m
    return None


def _is_rule(stripped: str) -> bool:
    return len(stripped) >= 8 and stripped.count("=") == len(stripped)


class _Pending:
    """A traceback (or torchelastic failure box) being collected."""

    __slots__ = (
        "after_last_error", "blanks", "box", "box_entry", "box_section", "cont", "exc", "first_line",
        "first_time", "frame", "frames", "half", "head", "indent", "last_line", "lead", "noise",
        "omitted", "rank", "rules", "tail", "total",
    )  # fmt: skip

    def __init__(self, lineno: int, time: float | None, rank: int | None, indent: int, half: int) -> None:
        self.first_line = lineno
        self.first_time = time
        self.last_line = lineno
        self.rank = rank
        self.indent = indent
        self.half = half
        self.head: list[str] = []
        self.tail: deque[str] = deque(maxlen=half)
        self.omitted = 0
        self.total = 0
        self.exc: list[tuple[str, int, float | None]] = []
        self.frame: str | None = None  # innermost training-code frame of the current section
        self.frames: list[str | None] = []
        self.noise = 0
        self.blanks = 0
        self.cont = 0
        self.after_last_error = False
        self.rules = 0
        self.box: list[tuple[str, dict[str, Any]]] = []
        self.box_entry: dict[str, Any] | None = None
        self.box_section = "other"
        self.lead: Hit | None = None  # a one-line error that a traceback may go on to explain

    def add(self, text: str, lineno: int) -> None:
        self.total += 1
        self.last_line = lineno
        if len(self.head) < self.half:
            self.head.append(text)
            return
        if len(self.tail) == self.half:
            self.omitted += 1
        self.tail.append(text)

    def evidence(self) -> list[str]:
        out = list(self.head)
        if self.omitted:
            out.append(f"... {self.omitted} lines omitted ...")
        out.extend(self.tail)
        return out

    def box_line(self, stripped: str) -> None:
        if stripped.startswith("Root Cause"):
            self.box_section = "root"
            return
        if stripped.startswith("Failures:"):
            self.box_section = "other"
            return
        if stripped.startswith("[") and stripped.endswith("]:"):
            self.box_entry = {}
            self.box.append((self.box_section, self.box_entry))
            return
        m = _BOX_FIELD.match(stripped)
        if m is None or self.box_entry is None or m[1] in self.box_entry:
            return
        key, val = m[1], m[2].strip()
        entry = self.box_entry
        entry[key] = val
        if key == "rank":
            r = _BOX_RANK.match(val)
            if r:
                entry["rank_n"] = int(r[1])
                if r[2]:
                    entry["local_rank"] = int(r[2])
        elif key == "exitcode":
            e = _BOX_EXIT.match(val)
            if e:
                entry["exitcode_n"] = int(e[1])
                if e[2]:
                    entry["pid"] = int(e[2])
        elif key == "traceback":
            s = _BOX_SIGNAL.search(val)
            if s:
                entry["signal"] = s[2]


class SignatureMatcher:
    """Turns the lines of one rank's stream into ``ErrorRecord``s.

    ``feed`` returns the records a line completes; a traceback's record comes out when
    the line after it shows it is over (or on ``flush``/``release``/``expire``).
    """

    def __init__(self, *, max_evidence: int = 200) -> None:
        self._state = _IDLE
        self._p: _Pending | None = None
        self._half = max(2, max_evidence // 2)
        self._seen: dict[tuple[Any, ...], int] = {}
        self._last: ErrorRecord | None = None
        self._last_line = 0
        self._last_wants_next = False
        self._oom_kill_line = -_OOM_KILL_NEAR - 1  # last line that reported a host OOM kill
        self._spawn: tuple[int, int] | None = None  # torch.multiprocessing's "-- Process N": (N, line)

    @property
    def waiting(self) -> bool:
        """A finished traceback is held back, waiting to see whether it continues."""
        return self._state == _TAIL or self._state == _CHAIN or self._state == _LEAD

    @property
    def busy(self) -> bool:
        return self._state != _IDLE

    def feed(
        self,
        text: str,
        lineno: int,
        rank: int | None = None,
        time: float | None = None,
        clean: bool = False,
    ) -> list[ErrorRecord]:
        """``clean``: the caller found that ``may_hold_signature`` is false for this line."""
        if self._state == _IDLE:
            if NOT_AN_ERROR in text:
                return []
            return self._idle(text, lineno, rank, time, clean)
        if self._state == _TB:
            return self._in_traceback(text, lineno, rank, time)
        if self._state == _TAIL:
            return self._in_tail(text, lineno, rank, time)
        if self._state == _CHAIN:
            return self._in_chain(text, lineno, rank, time)
        if self._state == _LEAD:
            return self._in_lead(text, lineno, rank, time)
        return self._in_box(text, lineno, rank, time)

    def flush(self) -> list[ErrorRecord]:
        """End of stream: whatever was being collected becomes a record."""
        out = self._finish() if self._p is not None else []
        self._last = None
        return out

    def release(self) -> list[ErrorRecord]:
        """The stream went quiet: hand out a finished traceback that was held back."""
        return self._finish() if self.waiting else []

    def expire(self, lineno: int) -> list[ErrorRecord]:
        """Hand out a held-back traceback once the stream is far past it."""
        p = self._p
        if self.waiting and p is not None and lineno - p.last_line > _TAIL_LINES:
            return self._finish()
        return []

    # -- idle ---------------------------------------------------------------------------

    def _idle(
        self, text: str, lineno: int, rank: int | None, time: float | None, clean: bool = False
    ) -> list[ErrorRecord]:
        last = self._last
        if last is not None:
            if lineno - self._last_line <= _ATTACH_LINES and (self._last_wants_next or _CONT.match(text)):
                if len(last.evidence) < 2 * self._half:
                    last.evidence.append(text)
                self._last_line = lineno
                self._last_wants_next = text.strip() == "Last error:"
                return []
            self._last = None
            self._last_wants_next = False
        if "Traceback" in text:
            s = text.lstrip()
            if s.startswith(_TB_HEAD) or (s.startswith("╭") and _TB_HEAD in s):
                p = self._start(text, lineno, rank, time, len(text) - len(s))
                spawn = self._spawn
                if rank is None and spawn is not None and 0 < lineno - spawn[1] <= 3:
                    p.rank = spawn[0]  # the child's traceback under "-- Process 1 terminated ..."
                return []
        if clean or not may_hold_signature(text):
            return []
        if text.startswith("-- Process "):  # holds "error": past the gate
            n = spawn_process(text)
            if n is not None:
                self._spawn = (n, lineno)
                return []
        if "ChildFailedError" in text:
            s = text.lstrip()
            if _is_exception_line(s):
                p = self._start(text, lineno, rank, time, len(text) - len(s))
                p.exc.append((s, lineno, time))
                p.frames.append(None)
                self._state = _BOX
                return []
        if _BOX_ROOT in text and text.lstrip().startswith(_BOX_ROOT):
            # A failure box whose ChildFailedError traceback was not kept: read from its root cause.
            p = self._start(text, lineno, rank, time, 0)
            p.rules = 1
            p.box_line(text.strip())
            self._state = _BOX
            return []
        hit = classify(text)
        if hit is None:
            return []
        if hit.kind == "oom":
            d = hit.details
            if d.get("host") and ("events" in d or "process" in d or "tasks" in d):
                self._oom_kill_line = lineno
        elif hit.details.get("shell") and lineno - self._oom_kill_line <= _OOM_KILL_NEAR:
            hit = _host_oom(
                _short(f"{text.strip()}: SIGKILL from the OOM killer (line {self._oom_kill_line})"),
                signal="SIGKILL",
                killed=True,
            )
        said = message_rank(text) if rank is None else None
        if said is not None:
            rank = said
        if hit.key is not None:
            # Unprefixed lines of several ranks share this matcher: the rank a message names
            # keeps their repetitions apart (one OOM is one event whoever tells it).
            key = hit.key if said is None or hit.kind == "oom" else (*hit.key, said)
            prev = self._remember(key, lineno)
            if prev is not None and lineno - prev <= _DEDUP_LINES:
                return []
        if hit.details.get("lead"):
            # torchrun logs the failed child, then raises ChildFailedError with a box that
            # names its global rank: one event, told best by the box when it comes.
            p = self._start(text, lineno, rank, time, 0)
            p.lead = hit
            self._state = _LEAD
            return []
        rec = ErrorRecord(
            kind=hit.kind,
            summary=hit.summary,
            evidence=[text],
            severity=hit.severity,
            details=hit.details,
            rank=rank,
            line=lineno,
            time=time,
        )
        self._last = rec
        self._last_line = lineno
        self._last_wants_next = False
        return [rec]

    def _remember(self, key: tuple[Any, ...], lineno: int) -> int | None:
        prev = self._seen.get(key)
        if prev is None and len(self._seen) >= 512:
            self._seen = {k: v for k, v in self._seen.items() if lineno - v <= _DEDUP_LINES}
        self._seen[key] = lineno
        return prev

    def _start(self, text: str, lineno: int, rank: int | None, time: float | None, indent: int) -> _Pending:
        self._last = None
        p = _Pending(lineno, time, rank, indent, self._half)
        p.add(text, lineno)
        self._p = p
        self._state = _TB
        return p

    def _in_lead(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.lstrip()
        if not s:
            p.blanks += 1
            return self._finish() if p.blanks > 2 else []
        if s.startswith(_TB_HEAD):
            p.add(text, lineno)
            p.indent = len(text) - len(s)
            p.blanks = 0
            self._state = _TB
            return []
        out = self._finish()
        out.extend(self._idle(text, lineno, rank, time))
        return out

    # -- inside a traceback ----------------------------------------------------------------

    def _in_traceback(
        self, text: str, lineno: int, rank: int | None, time: float | None
    ) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.lstrip()
        indent = len(text) - len(s)
        if s and indent > p.indent:
            p.add(text, lineno)
            if s.startswith('File "'):
                m = _FRAME.match(s)
                if m and not any(x in m[1] for x in _LIBRARY_PATH):
                    p.frame = f"{m[1]}:{m[2]} {m[3] or '?'}".rstrip()
            return self._finish() if p.total > _MAX_TB_LINES else []
        if s.startswith(_TB_HEAD):
            out = self._finish()
            self._start(text, lineno, rank, time, indent)
            return out
        if s[:1] in _RICH_BOX:
            p.add(text, lineno)
            m = _RICH_FRAME.match(s)
            if m and not any(x in m[1] for x in _LIBRARY_PATH):
                p.frame = f"{m[1]}:{m[2]} {m[3]}"
            return self._finish() if p.total > _MAX_TB_LINES else []
        if s and _is_exception_line(s.rstrip()):
            p.add(text, lineno)
            p.exc.append((s.rstrip(), lineno, time))
            p.frames.append(p.frame)
            p.frame = None
            p.blanks = 0
            p.cont = 0
            self._state = _BOX if "ChildFailedError" in s else _TAIL
            return []
        p.add(text, lineno)
        p.noise += 1
        return self._finish() if p.noise > _MAX_NOISE else []

    def _in_tail(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.strip()
        if not s:
            p.blanks += 1
            return self._finish() if p.blanks > 2 else []
        if s.startswith(_CHAIN_HEADS):
            p.add(text, lineno)
            self._state = _CHAIN
            return []
        if (
            p.blanks == 0
            and p.cont < 2 * self._half
            and (p.after_last_error or _CONT.match(text) or text[0].isspace())
        ):
            p.add(text, lineno)
            p.cont += 1
            p.after_last_error = s == "Last error:"
            return []
        out = self._finish()
        out.extend(self._idle(text, lineno, rank, time))
        return out

    def _in_chain(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.lstrip()
        if not s.strip():
            p.blanks += 1
            return self._finish() if p.blanks > 6 else []
        if s.startswith(_TB_HEAD):
            p.add(text, lineno)
            p.indent = len(text) - len(s)
            p.noise = 0
            self._state = _TB
            return []
        out = self._finish()
        out.extend(self._idle(text, lineno, rank, time))
        return out

    def _in_box(self, text: str, lineno: int, rank: int | None, time: float | None) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        s = text.strip()
        if _is_rule(s):
            p.add(text, lineno)
            p.rules += 1
            return self._finish() if p.rules >= 2 else []
        if p.rules == 0:
            if not s:
                p.blanks += 1
                return self._finish() if p.blanks > 2 else []
            out = self._finish()  # no box follows this ChildFailedError line
            out.extend(self._idle(text, lineno, rank, time))
            return out
        p.add(text, lineno)
        p.box_line(s)
        return self._finish() if p.total > 2000 else []

    # -- the record ------------------------------------------------------------------------

    def _finish(self) -> list[ErrorRecord]:
        p = self._p
        assert p is not None
        self._p = None
        self._state = _IDLE
        self._last = None
        details: dict[str, Any] = {"first_line": p.first_line}
        kind, severity = "crash", _C
        lead = p.lead
        if lead is not None:
            details = {**lead.details, **details}
            details.pop("lead", None)
        if lead is not None and not p.exc:
            kind, severity, summary = lead.kind, lead.severity, lead.summary
            line, time = p.first_line, p.first_time
            if p.total > 1:
                details["incomplete"] = True
        elif p.exc:
            summary, line, time = p.exc[-1]
            m = _EXC_LINE.match(summary)
            if m:
                details["exception"] = m[1]
                if m[2]:
                    details["message"] = m[2]
            if len(p.exc) > 1:
                details["chained"] = len(p.exc)
            frame = next((f for f in reversed(p.frames) if f), None)
            if frame:
                details["frame"] = frame
            hit = None
            for exc_line, _, _ in reversed(p.exc):
                h = classify(exc_line)
                if h is not None and h.kind != "crash":
                    hit = h
                    break
            if hit is not None:
                kind, severity = hit.kind, hit.severity
                details = {**hit.details, **details}
                if hit.key is not None:
                    prev = self._remember(hit.key, line)
                    if kind == "oom" and prev is not None and 0 <= line - prev <= _DEDUP_LINES:
                        return []  # the framework's one-line report of this OOM came first
            elif details.get("exception", "").endswith("KeyboardInterrupt"):
                severity = _W
            if p.box:
                summary = self._box_summary(p, details) or summary
        elif p.box:
            line, time = p.first_line, p.first_time
            summary = self._box_summary(p, details) or "torchelastic failure box"
            if "failed_rank" in details:
                details["said_rank"] = details["failed_rank"]  # the launcher's box names the rank
        else:
            line, time = p.last_line, p.first_time
            summary = "Traceback without its final exception line (stream ended or output interleaved)"
            if p.frame:
                details["frame"] = p.frame
            details["incomplete"] = True
            # Interleaved output can glue the exception onto a frame line ("main(args)RuntimeError:
            # [!] NaN loss with decoder_loss."): a known error in the frames still names it.
            for text in p.evidence():
                h = classify(text) if may_hold_signature(text) else None
                if h is not None and h.kind != "crash":
                    kind, severity, summary = h.kind, h.severity, h.summary
                    details = {**h.details, **details}
                    break
        evidence = p.evidence()
        rank = p.rank
        if rank is None:
            # No launcher prefix: the rank the error names itself (Megatron's "Rank 3: found NaN
            # ..."), or the process torch.multiprocessing.spawn says failed.
            said = details.get("said_rank")
            if said is None and p.exc:
                said = message_rank(p.exc[-1][0])
            if said is None:
                said = next((n for n in map(spawn_process, evidence) if n is not None), None)
            if said is not None:
                rank = details["said_rank"] = said
        rec = ErrorRecord(
            kind=kind,
            summary=_short(summary),
            evidence=evidence,
            severity=severity,
            details=details,
            rank=rank,
            line=line,
            time=time if time is not None else p.first_time,
        )
        return [rec]

    @staticmethod
    def _box_summary(p: _Pending, details: dict[str, Any]) -> str | None:
        roots = [e for sec, e in p.box if sec == "root"] or [e for _, e in p.box]
        if not roots:
            return None
        root = roots[0]
        details["failed_ranks"] = [e["rank_n"] for _, e in p.box if "rank_n" in e]
        for src, dst in (
            ("rank_n", "failed_rank"), ("local_rank", "local_rank"), ("exitcode_n", "exitcode"),
            ("pid", "pid"), ("signal", "signal"), ("host", "host"),
        ):  # fmt: skip
            if src in root:
                details[dst] = root[src]
        parts = ["torchelastic: rank", str(root.get("rank_n", "?"))]
        if "local_rank" in root:
            parts.append(f"(local_rank {root['local_rank']})")
        if root.get("host"):
            parts.append(f"on {root['host']}")
        parts.append(f"failed with exitcode {root.get('exitcode_n', '?')}")
        text = " ".join(parts)
        if "signal" in root:
            text += f" ({root['signal']})"
            if root["signal"] == "SIGKILL":
                text += " - SIGKILL usually means the host OOM killer"
        return text
