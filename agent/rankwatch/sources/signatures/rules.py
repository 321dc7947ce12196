"""The rules that read one line of error text: the wording frameworks, launchers, drivers and
schedulers really print (PyTorch's caching allocator and ProcessGroupNCCL, NCCL's own ``NCCL
WARN``, the NVIDIA kernel driver, Slurm's ``srun``/``slurmstepd``, torchelastic), old and new
variants alike. Each rule takes a line and returns a ``Hit`` or None; ``catalogue`` says which
lines each rule may see and in what order they are tried.
"""

from __future__ import annotations

import re
import signal
from typing import Any, NamedTuple

from rankwatch.records import Severity

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
    # PyTorch <= 1.0 (THC): "THCudaCheck FAIL file=... line=58 error=2 : out of memory" and
    # "RuntimeError: cuda runtime error (2) : out of memory at ...": 2 is cudaErrorMemoryAllocation.
    r"|\berror=2 : out of memory|cuda runtime error \(2\) : out of memory"
    # TensorFlow's BFC allocator: "ResourceExhaustedError: OOM when allocating tensor with shape[...]".
    r"|OOM when allocating tensor"
)
_OOM_TRIED = re.compile(r"Tried to allocate " + _SIZE)
# Before torch 2.1: "(GPU 0; 79.15 GiB total capacity; 1.2 GiB already allocated; 6.00 MiB free; ..."
_OOM_OLD = re.compile(
    r"\(GPU (\d+); " + _SIZE + r" total capacity(?:; " + _SIZE + r" already allocated)?"
    r"(?:; " + _SIZE + " free)?"
)
# Since: "GPU 0 has a total capacity of 79.11 GiB of which 6.00 MiB is free." (some say "capacty")
_OOM_NEW = re.compile(r"GPU (\d+) has a total capaci?ty of " + _SIZE + r" of which " + _SIZE + r" is free")
# PyTorch's host allocator (c10/core/CPUAllocator.cpp, later alloc_cpu.cpp): "DefaultCPUAllocator:
# can't allocate memory: you tried to allocate 67108864 bytes" (Linux), "... not enough memory:
# you tried to allocate 113246208 bytes. Buy new RAM!" (Windows).
_CPU_ALLOC = re.compile(
    r"DefaultCPUAllocator: (?:can't allocate|not enough) memory(?:: you tried to allocate (\d{1,20}) bytes)?"
)
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
# CPython's interpreter could not open the script it was given (Modules/main.c,
# pymain_run_file_obj: "%S: can't open file %R: [Errno %d] %s"; before 3.10 the path in plain
# quotes, "%ls: can't open file '%ls': [Errno %d] %s"): the process exits 2 before any code ran.
# Real: torchrun --tee 3 of a mistyped path, "[default0]:/work/venv/bin/python3: can't open file
# '/work/bb2/trian.py': [Errno 2] No such file or directory" (tests/data/blackbox/s35b/repro).
_CANT_OPEN = re.compile(
    r"^(\S{1,512}): can't open file (['\"])(.{1,4096})\2: \[Errno (\d{1,4})\] (.{1,200})$"
)
_UNCAUGHT = re.compile(r"\bUncaught ([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)): ?(.*)$")

# --- the rank a message names, for lines no launcher prefixed ------------------------------
# ProcessGroupNCCL's "[Rank 7] Watchdog caught ..." (the default group's rank, the global one;
# "[PG 1 Rank 3]" is a rank in a subgroup and is not used) and OLMo's "[olmo.util:158, rank=0]".
_MESSAGE_RANK = re.compile(
    r"\[Rank (\d{1,7})\]|[\[,] ?rank=(\d{1,7})\]"
    # Megatron: "Rank 3: found NaN in local grad norm ..." (param_and_grad_buffer.py) and its
    # rerun state machine's "Rank 2, node n01, device 2, iteration -1: Unexpected result nan".
    r"|\bRank (\d{1,7})(?::|, node )"
    # torchelastic's JSON event log: {"name": "torchelastic.worker.status.FAILED", "global_rank": 3}
    r'|"global_rank": ?(\d{1,7})'
    # OpenMPI's mpirun: "mpirun noticed that process rank 1 with PID 4242 on node n01 exited on ..."
    r"|\bnoticed that process rank (\d{1,7}) with PID"
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


# TensorFlow's NanTensorHook (training/basic_session_run_hooks.py) logs "Model diverged with loss
# = NaN." (as "ERROR:tensorflow:..." or absl's "E0606 ... basic_session_run_hooks.py:760] ...")
# before it raises NanLossDuringTrainingError.
_TF_DIVERGED = re.compile(r"Model diverged with loss = (NaN|nan|inf|Inf)")
# ESPnet2 (espnet2/train/trainer.py): "The grad norm is nan. Skipping updating the model." An
# inf there is the fp16 scaler's overflow, which the scaler handles; a NaN is not.
_GRAD_NORM_NAN_SKIP = re.compile(r"[Tt]he grad norm is (nan)\. Skipping updating the model")
# torch.distributions' argument check (distributions/distribution.py): "Expected parameter loc
# (Tensor of shape (1, 50)) of distribution Normal(...) to satisfy the constraint Real(), but found
# invalid values:" followed by the tensor, NaN as a rule: the network produced NaN.
_DIST_INVALID = re.compile(r"Expected parameter (\w{1,64}) .{0,400}?but found invalid values")


# YOLACT (utils/functions.py, MovingAverage.add) drops a non-finite loss from its running mean
# with print("Warning: Moving average ignored a value of %f"): the loss itself was NaN or inf.
_AVG_IGNORED = re.compile(r"Moving average ignored a value of (-?(?:nan|inf))\b")


def _nan_stopped(t: str) -> Hit | None:
    m = _TF_DIVERGED.search(t)
    if m is not None:
        return Hit("nan_loss", _C, "TensorFlow stopped: model diverged with loss = NaN", {}, ("tf_diverged",))
    m = _AVG_IGNORED.search(t)
    if m is not None:
        summary = f"the loss was {m[1]}: the trainer's moving average ignored it (YOLACT)"
        return Hit("nan_loss", _C, summary, {}, ("avg_ignored",))
    m = _GRAD_NORM_NAN_SKIP.search(t)
    if m is not None:
        return Hit(
            "nan_loss",
            _W,
            "the grad norm is NaN: the trainer skips the update (ESPnet)",
            {},
            ("grad_norm_nan_skip",),
        )
    m = _DIST_INVALID.search(t)
    if m is not None:
        summary = f"torch.distributions rejected parameter {m[1]}: invalid values (NaN from the network?)"
        return Hit("crash", _C, _short(summary), {"parameter": m[1]}, ("dist_invalid", m[1]))
    return None


# --- workers that died under another runtime ----------------------------------------------------
# Ray (core worker): "A worker died or was killed while executing a task by an unexpected system
# error." abseil's and glog's failure signal handlers: "*** SIGABRT received at time=1734086759
# ***", "*** SIGSEGV (@0x0) received by PID 1234 (TID 0x7f...) from PID 0; stack trace: ***".
# torchelastic's event log: {"name": "torchelastic.worker.status.FAILED", ... "global_rank": 3}.
_RAY_WORKER_DIED = re.compile(r"A worker died or was killed while executing (?:a|the) task")
_SIGNAL_RECEIVED = re.compile(
    r"\*\*\* (SIG[A-Z]{2,7}) (?:\(@0x[0-9a-f]{1,16}\) )?received (?:at time=|by PID)"
)
_ELASTIC_EVENT_FAILED = re.compile(r'"name": ?"torchelastic\.worker\.status\.FAILED"')


def _worker_died(t: str) -> Hit | None:
    m = _SIGNAL_RECEIVED.search(t)
    if m is not None:
        summary = f"the process received {m[1]} (failure signal handler)"
        return Hit("crash", _C, summary, {"signal": m[1]}, ("signal_received", m[1]))
    if _RAY_WORKER_DIED.search(t) is not None:
        return Hit(
            "crash", _C, "Ray: a worker died or was killed by an unexpected system error", {}, ("ray_died",)
        )
    if _ELASTIC_EVENT_FAILED.search(t) is not None:
        return Hit("crash", _C, "torchelastic: worker status FAILED", {}, ("elastic_event_failed",))
    return None


# --- training loops and data loaders that stop themselves ---------------------------------------
# The DETR/DeiT/MAE/DINO/ConvNeXt engines (engine.py: print("Loss is {}, stopping training")
# then sys.exit(1)): "Loss is nan, stopping training".
_LOSS_IS_STOP = re.compile(r"Loss is (nan|inf|-inf|NaN|Inf), stopping training")
# torch.utils.data's worker loop: "ERROR: Unexpected bus error encountered in worker. This might be
# caused by insufficient shared memory (shm)." and the parent's "DataLoader worker (pid(s) 12345)
# exited unexpectedly".
_DL_SHM = re.compile(
    r"Unexpected bus error encountered in worker\. This might be caused by insufficient shared memory"
)
_DL_EXITED = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]{1,64})\) exited unexpectedly")


def _stopped(t: str) -> Hit | None:
    m = _LOSS_IS_STOP.search(t)
    if m is not None:
        return Hit("nan_loss", _C, f"the trainer stopped: loss is {m[1]}", {}, ("loss_is_stop",))
    if _DL_SHM.search(t) is not None:
        summary = "a DataLoader worker hit a bus error: shared memory (/dev/shm) too small"
        return Hit("crash", _C, summary, {"dataloader": True, "shm": True}, ("dl_shm",))
    m = _DL_EXITED.search(t)
    if m is not None:
        summary = f"DataLoader worker (pid {m[1].strip()}) exited unexpectedly"
        return Hit("crash", _C, summary, {"dataloader": True, "pids": m[1].strip()}, ("dl_exited", m[1]))
    return None


# --- MPI launchers -------------------------------------------------------------------------------
# OpenMPI's mpirun (orte errmgr help texts): "mpirun noticed that process rank 1 with PID 4242 on
# node n01 exited on signal 9 (Killed)." and "mpirun detected that one or more processes exited
# with non-zero status, thus causing the job to be terminated." Horovod, when a peer failed:
# "Horovod has been shut down. This was caused by an exception on one of the ranks ...".
_MPI_SIGNAL = re.compile(
    r"noticed that process rank (\d{1,7}) with PID \S{1,16} on node \S{1,128} exited on signal (\d{1,3})"
)
_MPI_NONZERO = re.compile(r"detected that one or more processes exited with non-zero status")
_HOROVOD_DOWN = re.compile(
    r"Horovod has been shut down\. This (?:was|has been) caused by an exception on one of the ranks?"
)


def _mpi(t: str) -> Hit | None:
    m = _MPI_SIGNAL.search(t)
    if m is not None:
        sig = _SIGNUMS.get(int(m[2]), f"signal {m[2]}")
        summary = f"mpirun: rank {m[1]} exited on {sig}"
        if sig == "SIGKILL":
            summary += f": {_KILLED}"
        return Hit("crash", _C, summary, {"signal": sig, "said_rank": int(m[1])}, ("mpi_signal", m[1]))
    if _MPI_NONZERO.search(t) is not None:
        return Hit("crash", _C, "mpirun: a process exited with non-zero status", {}, ("mpi_nonzero",))
    if _HOROVOD_DOWN.search(t) is not None:
        return Hit(
            "crash",
            _C,
            "Horovod shut down: an exception on another rank ended the job",
            {},
            ("horovod_down",),
        )
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


# The loss scaler gave up (it raises, ending the run): DeepSpeed (runtime/fp16/loss_scaler.py)
# "Current loss scale already at minimum - cannot decrease scale anymore. Exiting run."; GPT-NeoX
# (megatron/utils.py, OverflowMonitor) "Skipped 50 iterations in a row due to Overflow - Exiting
# training."
_SCALE_EXHAUSTED = re.compile(
    r"Current loss scale already at minimum - cannot decrease scale anymore"
    r"|Skipped (\d{1,9}) iterations in a row due to Overflow"
    # fairseq (optim/dynamic_loss_scaler.py): "Minimum loss scale reached (0.0001). Your loss is
    # probably exploding."
    r"|Minimum loss scale reached \([-\w.+]{1,24}\)"
)


def _scale_exhausted(t: str) -> Hit | None:
    m = _SCALE_EXHAUSTED.search(t)
    if m is None:
        return None
    if m[1] is not None:
        summary = f"the run stopped: {m[1]} iterations in a row overflowed (fp16 loss scale exhausted)"
    else:
        summary = "the run stopped: the fp16 loss scale is at its minimum and steps still overflow"
    return Hit("loss_scale_collapse", _C, summary, {"exiting": True}, ("scale_exhausted",))


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

_KILLED = "killed (SIGKILL: the kernel OOM killer, scancel or a time limit)"
_SIGNUMS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}  # fmt: skip

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


def _cpu_alloc(t: str) -> Hit | None:
    m = _CPU_ALLOC.search(t)
    if m is None:
        return None
    return _host_oom(_short(t), **({"tried_bytes": int(m[1])} if m[1] else {}))


def _memory_error(t: str) -> Hit | None:
    if t.lstrip().startswith(("MemoryError", "builtins.MemoryError")):
        return _host_oom(_short(t))
    return None


def _dataloader_killed(t: str) -> Hit | None:
    # A SIGKILL names no sender (the OOM killer, a cgroup limit, scancel): a crash, which
    # SignatureMatcher makes an OOM when an OOM-kill line came just before, as for "Killed".
    m = _DL_KILLED.search(t)
    if m is None:
        return None
    return Hit(
        "crash", _C, _short(f"{t.strip()}: {_KILLED}"),
        {"signal": "SIGKILL", "killed": True, "shell": True, "dataloader": True, "pids": m[1].strip()},
    )  # fmt: skip


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


# torch.multiprocessing.spawn's join() (spawn.py) on a child that died without a Python
# exception: "ProcessExitedException: process 1 terminated with exit code 1" / "... with signal
# SIGKILL" (torch >= 1.5), a plain "Exception: process 3 terminated with signal SIGKILL" before.
# The process index is the local rank the spawned function received.
_SPAWN_EXITED = re.compile(
    r"Exception: process (\d{1,7}) terminated with (?:signal (SIG[A-Z0-9]{2,8})|exit code (-?\d{1,10}))"
)


def _spawn_exited(t: str) -> Hit | None:
    m = _SPAWN_EXITED.search(t)
    if m is None:
        return None
    d: dict[str, Any] = {"failed_rank": int(m[1]), "local_rank": int(m[1])}
    if m[2]:
        d["signal"] = m[2]
        number = getattr(signal.Signals, m[2], None)
        how = (
            f"was killed by signal {int(number)} ({m[2]})"
            if number is not None
            else f"terminated with {m[2]}"
        )
        if m[2] == "SIGKILL":
            d["killed"] = True
            how += " - SIGKILL usually means the host OOM killer"
    else:
        d["exitcode"] = int(m[3])
        how = f"terminated with exit code {m[3]}"
    summary = f"torch.multiprocessing.spawn: process {m[1]} {how}"
    return Hit("crash", _C, summary, d, ("spawn_exited", int(m[1])))


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


def _cant_open(t: str) -> Hit | None:
    m = _CANT_OPEN.match(t.strip())
    if m is None:
        return None
    d: dict[str, Any] = {"script": m[3], "errno": int(m[4]), "message": m[5].strip()}
    summary = _short(f"{m[1]} could not open the script {m[3]!r}: [Errno {m[4]}] {m[5].strip()}")
    return Hit("crash", _C, summary, d)


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
