"""The catalogue of error signatures: which lines each rule may see (its trigger words), the
kinds it reports, and the order rules are tried in; the fast gate built from every trigger; and
``classify``, which names the error a single line reports.

Most lines are not errors, so the gate spends a handful of substring tests per line; a rule's
regexes run only on lines that hold one of its trigger words.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rankwatch.errorkinds import BY_KIND, ERROR_KINDS
from rankwatch.records import Severity
from rankwatch.sources.signatures.rules import (
    _AVG_IGNORED,
    _C,
    _CANT_OPEN,
    _CPU_ALLOC,
    _CUDA_ERR,
    _DEVICE_ASSERT,
    _DIST_INVALID,
    _DL_EXITED,
    _DL_KILLED,
    _DL_SHM,
    _DS_LAUNCHER_EXIT,
    _DUMP_SIGNAL,
    _ELASTIC_EVENT_FAILED,
    _ELASTIC_FAILED,
    _GPU_OOM,
    _GRAD_NORM_NAN_SKIP,
    _GRAD_SCALE_SMALL,
    _HOROVOD_DOWN,
    _KERNEL_OOM,
    _LAUNCH_DIED,
    _LOSS_IS_STOP,
    _MPI_NONZERO,
    _MPI_SIGNAL,
    _NAN_AT_ITER,
    _NAN_GRAD_NORM,
    _NAN_LOSS_WITH,
    _NCCL_ABORTED,
    _NCCL_CODE,
    _NCCL_ERROR,
    _NCCL_ERROR_IN,
    _NCCL_STUCK,
    _NCCL_TIMEOUT,
    _NCCL_WARN,
    _PEER_LOST,
    _PEER_WHERE,
    _PYSPY_THREAD,
    _RAY_WORKER_DIED,
    _SCALE_EXHAUSTED,
    _SHELL_SIGNAL,
    _SIGNAL_RECEIVED,
    _SLURM_CANCEL,
    _SLURM_OOM,
    _SPAWN_EXITED,
    _SRUN,
    _TF_DIVERGED,
    _UNCAUGHT,
    _W,
    _WHAT,
    _XID,
    Hit,
    _cant_open,
    _cpu_alloc,
    _cuda,
    _dataloader_killed,
    _device_assert,
    _ds_launcher_exit,
    _dump_signal,
    _elastic_failed,
    _fatal_python,
    _gpu_oom_rule,
    _grad_scale_small,
    _host_oom,
    _kernel_oom,
    _launch_died,
    _memory_error,
    _mpi,
    _nan_raised,
    _nan_stopped,
    _nccl_aborted,
    _nccl_code,
    _nccl_error,
    _nccl_error_in,
    _nccl_stuck,
    _nccl_timeout,
    _nccl_timeout_text,
    _nccl_warn,
    _peer,
    _pyspy,
    _scale_exhausted,
    _shell_signal,
    _short,
    _slurm_cancel,
    _slurm_oom,
    _spawn_exited,
    _srun,
    _stopped,
    _uncaught,
    _worker_died,
    _xid,
)


# A C++ exception that ended the process: the message it carries may be a known error itself.
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
        triggers=("emory", "_STATUS_", "_OUT_OF_MEMORY", "OOM when"),
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
        name="cpu_allocator_oom",
        kinds=("oom",),
        severity=_C,
        triggers=("DefaultCPUAllocator",),
        rule=_cpu_alloc,
        patterns=(_CPU_ALLOC,),
        example="RuntimeError: [enforce fail at CPUAllocator.cpp:64] . DefaultCPUAllocator: can't allocate "
        "memory: you tried to allocate 67108864 bytes. Error code 12 (Cannot allocate memory)",
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
        kinds=("crash", "oom"),
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
        name="scale_exhausted",
        kinds=("loss_scale_collapse",),
        severity=_C,
        triggers=("minimum - cannot decrease", "in a row due to Overflow", "Minimum loss scale reached"),
        rule=_scale_exhausted,
        patterns=(_SCALE_EXHAUSTED,),
        example="Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
        "Exiting run.",
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
        name="nan_stopped",
        kinds=("nan_loss", "crash"),
        severity=_C,
        triggers=(
            "diverged with loss",
            "grad norm is nan",
            "found invalid values",
            "average ignored a value",
        ),
        rule=_nan_stopped,
        patterns=(_TF_DIVERGED, _GRAD_NORM_NAN_SKIP, _DIST_INVALID, _AVG_IGNORED),
        example="ERROR:tensorflow:Model diverged with loss = NaN.",
    ),
    Signature(
        name="stopped",
        kinds=("nan_loss", "crash"),
        severity=_C,
        triggers=(
            "stopping training",
            "bus error encountered",  # holds "rror", in the gate already
            "exited unexpectedly",
        ),
        rule=_stopped,
        patterns=(_LOSS_IS_STOP, _DL_SHM, _DL_EXITED),
        example="Loss is nan, stopping training",
    ),
    Signature(
        name="mpi",
        kinds=("crash",),
        severity=_C,
        triggers=(
            "exited on signal",
            "exited with non-zero status",
            "xception on one of the rank",
        ),  # "xit", "xception": in the gate already
        rule=_mpi,
        patterns=(_MPI_SIGNAL, _MPI_NONZERO, _HOROVOD_DOWN),
        example="mpirun noticed that process rank 7 with PID 0 on node HOSTNAME exited on signal 9 (Killed).",
    ),
    Signature(
        name="worker_died",
        kinds=("crash",),
        severity=_C,
        triggers=("received", "worker died or was killed", "status.FAILED"),
        rule=_worker_died,
        patterns=(_SIGNAL_RECEIVED, _RAY_WORKER_DIED, _ELASTIC_EVENT_FAILED),
        example="(RayTrainWorker pid=7315) *** SIGABRT received at time=1734086759 ***",
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
        name="spawn_exited",
        kinds=("crash",),
        severity=_C,
        triggers=("terminated with ",),
        context=("Exception: process ",),
        rule=_spawn_exited,
        patterns=(_SPAWN_EXITED,),
        example="torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal "
        "SIGKILL",
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
        name="cant_open_script",
        kinds=("crash",),
        severity=_C,
        triggers=("can't open file",),
        rule=_cant_open,
        patterns=(_CANT_OPEN,),
        example="/work/venv/bin/python3: can't open file '/work/bb2/trian.py': [Errno 2] No such file or "
        "directory",
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
