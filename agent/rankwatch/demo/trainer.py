"""One fake rank of a distributed training job, printing what real frameworks print.

rankwatch only reads what a job leaves behind, so its most faithful test double is a
process whose log lines are byte-for-byte those of Megatron-LM, the Hugging Face
Trainer, nanoGPT, torchtitan or a key=value logger, and which fails the way real jobs
fail: grad norm blowing up into NaN, loss spikes, slow steps, one rank stuck in its
data loader while its peers wait in a collective, CUDA errors, OOMs, SIGKILL.

Ranks synchronise through files in ``--sync-dir`` (a fake ``all_reduce``), so a hang on
one rank stalls the others inside ``all_reduce`` just as NCCL would, and a dead peer
ends in the NCCL watchdog's timeout text. Pure stdlib: no torch, no GPU, no network.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import ClassVar, TextIO, cast

FORMATS = ("megatron", "hf", "nanogpt", "torchtitan", "kv")
FAULT_KINDS = (
    "nan",
    "nan_flat",
    "spike",
    "diverge",
    "plateau",
    "overfit",
    "slow",
    "hang",
    "crash",
    "oom",
    "kill",
    "exit",
)
SEQ_LEN = 1024
GPU_TOTAL_GIB = 79.15  # what torch reports for an 80 GB H100
FIRST_STEP_FACTOR = 6.0  # compilation, allocator warm-up, NCCL lazy init
TARGET_MFU = 0.4  # the model size is chosen so a nominal step reaches this

_FAULT_RE = re.compile(r"^(?P<kind>[a-z_]+)@(?P<step>\d+)(?::rank=(?P<rank>\d+))?$")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    step: int
    rank: int | None = None  # None: every rank

    @classmethod
    def parse(cls, text: str) -> Fault:
        m = _FAULT_RE.match(text.strip())
        if m is None or m["kind"] not in FAULT_KINDS:
            raise ValueError(
                f"bad fault {text!r}: expected KIND@STEP[:rank=R], KIND one of {', '.join(FAULT_KINDS)}"
            )
        rank = m["rank"]
        return cls(m["kind"], int(m["step"]), None if rank is None else int(rank))

    def applies_to(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank


@dataclass(frozen=True, slots=True)
class Profile:
    """Typical magnitudes of one kind of run, so each format's numbers look like its users'."""

    peak_lr: float
    loss_floor: float
    loss_drop: float
    grad_floor: float
    grad_peak: float
    peak_tflops: float  # what the framework divides by for MFU


PROFILES = {
    "megatron": Profile(3e-4, 2.6, 8.2, 0.25, 12.0, 989.0),
    "hf": Profile(5e-5, 1.55, 1.1, 0.6, 6.0, 989.0),
    "nanogpt": Profile(6e-4, 2.9, 8.1, 0.3, 10.0, 312.0),
    "torchtitan": Profile(8e-4, 2.4, 9.4, 0.3, 15.0, 989.0),
    "kv": Profile(3e-4, 2.2, 6.0, 0.4, 8.0, 989.0),
}


@dataclass(frozen=True, slots=True)
class Point:
    loss: float
    grad_norm: float
    lr: float
    eval_loss: float


class Curves:
    """Loss, grad norm and learning rate of a healthy run, bent by this rank's faults.

    Noise is seeded per step from one seed shared by all ranks: data-parallel ranks log
    the same all-reduced loss, so a healthy job's ranks agree, as in real logs.
    """

    def __init__(self, profile: Profile, total_steps: int, seed: int, faults: list[Fault]) -> None:
        self._p = profile
        self._total = max(1, total_steps)
        self._seed = seed
        self._faults = faults
        self.warmup = max(1, min(self._total // 20, 2000))
        self._tau = max(5.0, self._total / 6)
        self._tau_grad = max(2.0, self._total / 40)

    def lr(self, step: int) -> float:
        peak = self._p.peak_lr
        if step <= self.warmup:
            return peak * step / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self._total - self.warmup))
        low = 0.1 * peak
        return low + 0.5 * (peak - low) * (1.0 + math.cos(math.pi * progress))

    def _base_loss(self, step: int) -> float:
        return self._p.loss_floor + self._p.loss_drop * math.exp(-step / self._tau)

    def at(self, step: int) -> Point:
        rng = random.Random(f"{self._seed}:{step}")
        curve_step = step
        for f in self._faults:
            if f.kind == "plateau" and step >= f.step:
                curve_step = min(curve_step, f.step)
        loss = self._base_loss(curve_step) * (1.0 + 0.012 * rng.gauss(0.0, 1.0))
        grad = self._p.grad_floor + self._p.grad_peak * math.exp(-(step - 1) / self._tau_grad)
        grad *= math.exp(0.08 * rng.gauss(0.0, 1.0))
        eval_step = curve_step
        eval_scale = 1.0
        for f in self._faults:
            if f.kind == "overfit" and step > f.step:
                eval_step = min(eval_step, f.step)
                eval_scale *= 1.0 + 0.006 * (step - f.step)
        eval_loss = self._base_loss(eval_step) * 1.015 * eval_scale * (1.0 + 0.004 * rng.gauss(0.0, 1.0))
        for f in self._faults:
            k = step - f.step
            if f.kind == "diverge" and k >= 0:
                loss *= 1.04 ** (k + 1)
                eval_loss *= 1.04 ** (k + 1)
                grad *= 1.06 ** (k + 1)
            elif f.kind == "spike" and k == 0:
                loss *= 3.0
                grad *= 4.0
            elif f.kind == "nan" and -4 <= k < 0:
                grad *= 3.0 ** (k + 5)
                loss *= 1.0 + 0.02 * (k + 5)
            if f.kind in ("nan", "nan_flat") and k >= 0:
                loss = grad = eval_loss = math.nan
        return Point(loss, grad, self.lr(step), eval_loss)


class Console:
    """Line-buffered writes to the current stdout/stderr, optionally launcher-prefixed."""

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix

    def out(self, text: str = "") -> None:
        self._lines(sys.stdout, text)

    def err(self, text: str = "") -> None:
        self._lines(sys.stderr, text)

    def err_raw(self, text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    def _lines(self, stream: TextIO, text: str) -> None:
        stream.write("".join(f"{self._prefix}{line}\n" for line in text.split("\n")))
        stream.flush()


class Terminated(Exception):
    """SIGTERM arrived; raised from the handler so blocking waits unwind too."""


class FaultExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class InjectedFailure(RuntimeError):
    """Base of the simulated CUDA failures; subclasses print under torch's own names."""


class CUDAError(InjectedFailure):
    pass


CUDAError.__module__ = "builtins"
CUDAError.__qualname__ = "RuntimeError"


class OutOfMemoryError(InjectedFailure):
    pass


OutOfMemoryError.__module__ = "torch"
OutOfMemoryError.__qualname__ = "OutOfMemoryError"


class CollectiveTimeout(Exception):
    def __init__(self, seq: int, numel: int, timeout_s: float, ran_s: float) -> None:
        super().__init__(f"collective {seq} timed out after {ran_s:.1f}s")
        self.seq = seq
        self.numel = numel
        self.timeout_s = timeout_s
        self.ran_s = ran_s


class FakeDataLoader:
    """Hands out batches; at the hang step it waits for a batch that never comes.

    The wait is on an Event nobody sets, so a py-spy dump of the stuck rank shows
    ``wait_for_batch`` under ``__next__``, like a data-loader worker that died.
    """

    def __init__(self, hang_at: int | None) -> None:
        self._hang_at = hang_at
        self._index = 0
        self._batch_ready = threading.Event()

    def __iter__(self) -> FakeDataLoader:
        return self

    def __next__(self) -> list[int]:
        self._index += 1
        if self._index == self._hang_at:
            self.wait_for_batch()
        return [self._index] * 8

    def wait_for_batch(self) -> None:
        self._batch_ready.wait()


@dataclass(slots=True)
class FileProcessGroup:
    """A barrier through marker files, standing in for NCCL between fake ranks.

    Each rank touches ``step-<S>-rank-<R>`` and waits until every rank's marker for S
    exists. Once a rank is past barrier S, every rank is past S-1, so S-1 markers are
    dead and each rank removes its own: the folder holds at most two files per rank.
    """

    sync_dir: Path
    rank: int
    world: int
    timeout_s: float
    numel: int
    seq: int = 2  # collectives already issued by init (barrier, broadcast)

    def marker(self, step: int, rank: int) -> Path:
        return self.sync_dir / f"step-{step}-rank-{rank}"

    def clear_own(self) -> None:
        for path in self.sync_dir.glob(f"step-*-rank-{self.rank}"):
            path.unlink(missing_ok=True)


def all_reduce(tensor: list[float], *, group: FileProcessGroup | None, step: int) -> list[float]:
    """Block until every rank reached this step; a dead or stuck peer blocks us here."""
    if group is None or group.world <= 1:
        return tensor
    group.seq += 1
    group.marker(step, group.rank).touch()
    waiting = [r for r in range(group.world) if r != group.rank]
    start = time.monotonic()
    while waiting:
        waiting = [r for r in waiting if not group.marker(step, r).exists()]
        if not waiting:
            break
        elapsed = time.monotonic() - start
        if elapsed > group.timeout_s:
            raise CollectiveTimeout(group.seq, group.numel, group.timeout_s, elapsed)
        time.sleep(0.005)
    group.marker(step - 1, group.rank).unlink(missing_ok=True)
    return tensor


@dataclass(slots=True)
class StepLog:
    step: int
    loss: float  # this step's loss
    loss_avg: float  # mean over the logging interval (NaN if any step was NaN)
    grad_norm: float
    lr: float
    step_time_s: float  # mean over the logging interval
    nan_iters: int
    tokens_per_s: float  # per device
    tflops: float  # per device
    mfu: float  # ratio against the format's peak
    mem_gib: float
    consumed_samples: int
    epoch: float


class Run:
    """Everything fixed for this rank's run, derived once from the arguments."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank: int = args.rank
        self.world: int = args.world_size
        self.local_rank: int = args.local_rank if args.local_rank is not None else self.rank % 8
        self.steps: int = args.steps
        self.total_steps: int = args.total_steps or args.steps
        self.profile = PROFILES[args.format]
        self.faults = [f for f in args.fault if f.applies_to(self.rank)]
        self.console = Console(f"[rank{self.rank}]:" if args.prefix_rank else "")
        self.color = args.color == "always" or (args.color == "auto" and args.format == "torchtitan")
        self.host = socket.gethostname().split(".")[0] or "node01"
        self.tokens_per_step: int = args.tokens_per_step
        self.global_batch = max(1, self.tokens_per_step // SEQ_LEN)
        nominal = max(args.step_time, 1e-3)
        flops = TARGET_MFU * self.profile.peak_tflops * 1e12 * nominal * self.world
        self.n_params = max(1_000_000, int(flops / (6 * self.tokens_per_step)))
        self.mem_gib = 0.42 * GPU_TOTAL_GIB + 0.37 * self.local_rank
        self.logs_steps = args.all_ranks_log or self._framework_logs_steps()
        self.step = 0
        self._jitter = random.Random(f"{args.seed}:time:{self.rank}")

    def _framework_logs_steps(self) -> bool:
        if self.args.format == "kv":
            return True
        if self.args.format == "megatron":
            return self.rank == self.world - 1  # print_rank_last
        return self.rank == 0

    def fault(self, step: int, *kinds: str) -> Fault | None:
        for f in self.faults:
            if f.step == step and f.kind in kinds:
                return cast(Fault, f)
        return None

    def first_fault_step(self, kind: str) -> int | None:
        steps = [f.step for f in self.faults if f.kind == kind]
        return min(steps) if steps else None

    def work_seconds(self, step: int) -> float:
        seconds = self.args.step_time * (FIRST_STEP_FACTOR if step == 1 else 1.0)
        if any(f.kind == "slow" and step >= f.step for f in self.faults):
            seconds *= 4.0
        return max(0.0, float(seconds * (1.0 + 0.03 * self._jitter.gauss(0.0, 1.0))))


def _compute(seconds: float, busy: bool) -> None:
    end = time.perf_counter() + seconds
    if not busy:
        time.sleep(seconds)
        return
    x = 1.0
    while time.perf_counter() < end:
        for _ in range(2000):
            x = x * 1.0000001 + 1e-9


def _float32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _gib(x: float) -> str:
    return f"{x:.2f} GiB"


def _attention_forward(batch: list[int], fault: Fault) -> None:
    if fault.kind == "oom":
        raise OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {_gib(2.0)}. GPU 0 has a total capacity of "
            f"{_gib(GPU_TOTAL_GIB)} of which {_gib(1.19)} is free. Including non-PyTorch memory, this "
            f"process has {_gib(77.94)} memory in use. Of the allocated memory {_gib(74.12)} is allocated "
            f"by PyTorch, and {_gib(2.31)} is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        )
    raise CUDAError(
        "CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
    )


def model_forward(batch: list[int], fault: Fault | None) -> None:
    if fault is not None:
        _attention_forward(batch, fault)


def forward_backward_step(run: Run, curves: Curves, batch: list[int], step: int) -> Point:
    if run.fault(step, "kill") is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if run.fault(step, "exit") is not None:
        raise FaultExit(3)
    _compute(run.work_seconds(step), run.args.busy)
    model_forward(batch, run.fault(step, "crash", "oom"))
    return curves.at(step)


def train_step(
    run: Run, loader: FakeDataLoader, group: FileProcessGroup | None, curves: Curves, step: int
) -> Point:
    batch = next(loader)
    point = forward_backward_step(run, curves, batch, step)
    all_reduce([point.grad_norm], group=group, step=step)
    return point


@dataclass(frozen=True, slots=True)
class _Colors:
    """torchtitan's Color: ANSI escapes, or empty strings when colour is off."""

    red: str = ""
    green: str = ""
    yellow: str = ""
    blue: str = ""
    magenta: str = ""
    cyan: str = ""
    white: str = ""
    reset: str = ""
    orange: str = ""
    turquoise: str = ""

    @classmethod
    def ansi(cls) -> _Colors:
        return cls(
            red="\033[31m",
            green="\033[32m",
            yellow="\033[33m",
            blue="\033[34m",
            magenta="\033[35m",
            cyan="\033[36m",
            white="\033[37m",
            reset="\033[39m",
            orange="\033[38;2;255;165;0m",
            turquoise="\033[38;2;54;234;195m",
        )


class LogFormat(ABC):
    """How one framework prints: preamble, step lines, eval lines, the end."""

    name: ClassVar[str] = ""
    epochs: ClassVar[int] = 1

    def __init__(self, run: Run) -> None:
        self.run = run
        self.c = run.console

    def preamble(self) -> None:
        self.nccl_init()

    @abstractmethod
    def step(self, m: StepLog) -> None:
        """One logged step, as the framework prints it."""

    @abstractmethod
    def evaluation(self, step: int, eval_loss: float, epoch: float) -> None:
        """One evaluation result, as the framework prints it."""

    def finish(self, train_loss: float, runtime_s: float) -> None:  # noqa: B027 - most print no summary
        pass

    def nccl_init(self) -> None:
        """What NCCL_DEBUG=INFO prints while the communicator forms; every rank prints it."""
        r = self.run
        pid = os.getpid()
        dev = r.local_rank
        main = f"{r.host}:{pid}:{pid} [{dev}] NCCL INFO "
        init = f"{r.host}:{pid}:{pid + 61} [{dev}] NCCL INFO "
        ip = f"10.0.{r.rank // 8}.{11 + r.rank // 8}"
        comm = f"0x{0x55D1A2C0 + 0x1000 * r.rank:x}"
        ident = f"comm {comm} rank {r.rank} nranks {r.world} cudaDev {dev} nvmlDev {dev} busId {18 + dev}000"
        commid = "commId 0x9a1f3c5e2b7d4e10"
        lines = [
            main + f"Bootstrap : Using eth0:{ip}<0>",
            main + "NET/Plugin: No plugin found (libnccl-net.so)",
            main + "cudaDriverVersion 12040",
        ]
        if r.rank == 0:
            lines.append("NCCL version 2.21.5+cuda12.4")
        lines += [
            init + f"NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:{ip}<0>",
            init + "Using network IB",
            init + f"{ident} {commid} - Init START",
        ]
        if r.rank == 0:
            ring = "".join(f"{i:4d}" for i in range(r.world))
            lines += [init + f"Channel {c:02d}/02 : {ring}" for c in range(2)]
        up = r.rank - 1 if r.rank > 0 else -1
        down = r.rank + 1 if r.rank + 1 < r.world else -1
        nxt = (r.rank + 1) % r.world
        lines += [
            init + f"Trees [0] {down}/-1/-1->{r.rank}->{up} [1] {down}/-1/-1->{r.rank}->{up}",
            init + f"Channel 00/0 : {r.rank}[{dev}] -> {nxt}[{nxt % 8}] via P2P/CUMEM/read",
            init + f"Channel 01/0 : {r.rank}[{dev}] -> {nxt}[{nxt % 8}] via P2P/CUMEM/read",
            init + "Connected all rings",
            init + "Connected all trees",
            init + "threadThresholds 8/8/64 | 16/8/64 | 512 | 512",
            init + "2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, "
            "2 p2p channels per peer",
            init + f"{ident} {commid} - Init COMPLETE",
        ]
        self.c.out("\n".join(lines))


def _now(fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return datetime.now().strftime(fmt)


class MegatronFormat(LogFormat):
    name = "megatron"

    def preamble(self) -> None:
        r = self.run
        if r.rank == 0:
            w = r.world
            args = {
                "bf16": True,
                "global_batch_size": r.global_batch,
                "log_interval": r.args.log_every,
                "lr": r.profile.peak_lr,
                "lr_decay_style": "cosine",
                "lr_warmup_iters": max(1, min(r.total_steps // 20, 2000)),
                "micro_batch_size": max(1, r.global_batch // w),
                "min_lr": float(f"{0.1 * r.profile.peak_lr:.6g}"),
                "seq_length": SEQ_LEN,
                "train_iters": r.total_steps,
                "world_size": w,
            }
            self.c.out(
                f"using world size: {w}, data-parallel size: {w}, context-parallel size: 1, "
                "tensor-model-parallel size: 1, pipeline-model-parallel size: 1 \n"
                "using torch.bfloat16 for parameters ...\n"
                "------------------------ arguments ------------------------\n"
                + "\n".join(f"  {k} {'.' * (48 - len(k))} {v}" for k, v in args.items())
                + "\n-------------------- end of arguments ---------------------\n"
                "> building GPT2BPETokenizer tokenizer ...\n"
                " > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)\n"
                "> initializing torch distributed ..."
            )
        self.nccl_init()
        if r.rank == 0:
            self.c.out(
                "> initialized tensor model parallel with size 1\n"
                "> initialized pipeline model parallel with size 1\n"
                f"> setting random seeds to {r.args.seed} ...\n"
                "> compiling dataset index builder ...\n"
                ">>> done with dataset index builder. Compilation time: 0.043 seconds\n"
                "time to initialize megatron (seconds): 9.876\n"
                f"[after megatron is initialized] datetime: {_now()} \n"
                "building GPT model ...\n"
                f" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): {r.n_params}\n"
                "> learning rate decay style: cosine\n"
                f"[after model, optimizer, and learning rate scheduler are built] datetime: {_now()} \n"
                "> building train, validation, and test datasets ...\n"
                f"[after dataloaders are built] datetime: {_now()} \n"
                "done with setup ...\n"
                "training ...\n"
                f"[before the start of training step] datetime: {_now()} "
            )
        self._memory_reported = False

    def step(self, m: StepLog) -> None:
        r = self.run
        if r.logs_steps:
            s = f" [{_now()}]"
            s += f" iteration {m.step:8d}/{r.total_steps:8d} |"
            s += f" consumed samples: {m.consumed_samples:12d} |"
            s += f" elapsed time per iteration (ms): {m.step_time_s * 1000.0:.1f} |"
            s += f" throughput per GPU (TFLOP/s/GPU): {m.tflops:.1f} |"
            s += f" learning rate: {m.lr:.6E} |"
            s += f" global batch size: {r.global_batch:5d} |"
            # Real Megatron drops the loss field when the average is not > 0 (NaN included);
            # it is kept here so the NaN is visible on the line.
            s += f" lm loss: {m.loss_avg:.6E} |"
            s += f" loss scale: {1.0:.1f} |"
            s += f" grad norm: {m.grad_norm:.3f} |"
            s += f" number of skipped iterations: {0:3d} |"
            s += f" number of nan iterations: {m.nan_iters:3d} |"
            self.c.out(s)
        if not self._memory_reported and r.rank == 0:
            self._memory_reported = True
            alloc = round(r.mem_gib * 1024 * 0.81 * 256) / 256
            peak = round(alloc * 1.18 * 256) / 256
            reserved = float(round(r.mem_gib * 1024))
            self.c.out(
                f"[Rank {r.rank}] (after {m.step} iterations) memory (MB) | allocated: {alloc} | "
                f"max allocated: {peak} | reserved: {reserved} | max reserved: {reserved}"
            )

    def evaluation(self, step: int, eval_loss: float, epoch: float) -> None:
        if not self.run.logs_steps:
            return
        ppl = math.exp(min(20.0, eval_loss)) if not math.isnan(eval_loss) else math.nan
        s = f" validation loss at iteration {step} | "
        s += f"lm loss value: {eval_loss:.6E} | lm loss PPL: {ppl:.6E} | "
        dashes = "-" * (len(s) + 1)
        self.c.out(f"{dashes}\n{s}\n{dashes}")

    def finish(self, train_loss: float, runtime_s: float) -> None:
        if self.run.rank == 0:
            self.c.out(f"[after training is done] datetime: {_now()} ")


class _Bar:
    """tqdm's default bar as it looks on a non-tty stderr: 10 cells, redrawn with \\r."""

    CELLS = " ▏▎▍▌▋▊▉█"

    def __init__(self, console: Console, total: int) -> None:
        self.c = console
        self.total = max(1, total)
        self.n = 0
        self.start = time.monotonic()
        self._drawn_at = 0.0
        self._last_len = 0

    @staticmethod
    def _interval(seconds: float) -> str:
        mins, s = divmod(int(seconds), 60)
        h, m = divmod(mins, 60)
        return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"

    def text(self) -> str:
        frac = min(1.0, self.n / self.total)
        full, part = divmod(int(frac * 10 * 8), 8)
        bar = self.CELLS[-1] * full
        if full < 10:
            bar += self.CELLS[part] + " " * (10 - full - 1)
        elapsed = time.monotonic() - self.start
        if self.n == 0 or elapsed <= 0:
            tail = f"[{self._interval(elapsed)}<?, ?it/s]"
        else:
            rate = self.n / elapsed
            remaining = self._interval((self.total - self.n) / rate)
            speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
            tail = f"[{self._interval(elapsed)}<{remaining}, {speed}]"
        return f"{frac * 100:3.0f}%|{bar}| {self.n}/{self.total} {tail}"

    def update(self, n: int, force: bool = False) -> None:
        self.n = n
        now = time.monotonic()
        if force or now - self._drawn_at >= 0.1:
            self._drawn_at = now
            self.draw()

    def draw(self) -> None:
        text = self.text()
        pad = " " * max(0, self._last_len - len(text))
        self._last_len = len(text)
        self.c.err_raw(f"\r{text}{pad}")

    def clear(self) -> None:
        self.c.err_raw("\r" + " " * self._last_len + "\r")

    def close(self) -> None:
        self.draw()
        self.c.err_raw("\n")


class HFFormat(LogFormat):
    name = "hf"
    epochs = 3

    def _info(self, line: int, text: str, where: str = "trainer.py") -> None:
        """One logger.info record in transformers' explicit format (multi-line: one prefix)."""
        stamp = _now("%Y-%m-%d %H:%M:%S,") + f"{datetime.now().microsecond // 1000:03d}"
        self.c.err(f"[INFO|{where}:{line}] {stamp} >> {text}")

    def preamble(self) -> None:
        r = self.run
        if r.rank == 0:
            self._info(3937, "loading weights file model.safetensors from cache", "modeling_utils.py")
            self._info(
                4800,
                "All model checkpoint weights were used when initializing LlamaForCausalLM.",
                "modeling_utils.py",
            )
        self.nccl_init()
        if r.rank == 0:
            per_device = max(1, r.global_batch // r.world)
            lines = (
                "***** Running training *****",
                f"  Num examples = {r.total_steps * r.global_batch // self.epochs:,}",
                f"  Num Epochs = {self.epochs:,}",
                f"  Instantaneous batch size per device = {per_device:,}",
                "  Total train batch size (w. parallel, distributed & accumulation) = "
                f"{per_device * r.world:,}",
                "  Gradient Accumulation steps = 1",
                f"  Total optimization steps = {r.total_steps:,}",
                f"  Number of trainable parameters = {r.n_params:,}",
            )
            for i, line in enumerate(lines):
                self._info(2314 + i, line)
        self.bar = _Bar(self.c, r.total_steps) if r.logs_steps else None
        if self.bar:
            self.bar.update(0, force=True)

    def _write(self, logs: dict[str, float]) -> None:
        if self.bar:
            self.bar.clear()
        self.c.out(str(logs))
        if self.bar:
            self.bar.draw()

    def step(self, m: StepLog) -> None:
        if not self.bar:
            return
        self.bar.update(m.step)
        self._write(
            {
                "loss": round(m.loss_avg, 4),
                "grad_norm": _float32(m.grad_norm),
                "learning_rate": m.lr,
                "epoch": round(m.epoch, 2),
            }
        )

    def evaluation(self, step: int, eval_loss: float, epoch: float) -> None:
        if not self.bar:
            return
        runtime = max(1e-3, 2 * self.run.args.step_time)
        samples = 256
        self._write(
            {
                "eval_loss": _float32(eval_loss),
                "eval_runtime": round(runtime, 4),
                "eval_samples_per_second": round(samples / runtime, 3),
                "eval_steps_per_second": round(samples / 8 / runtime, 3),
                "epoch": round(epoch, 2),
            }
        )

    def finish(self, train_loss: float, runtime_s: float) -> None:
        r = self.run
        if self.bar:
            self.bar.n = r.steps
            runtime = max(runtime_s, 1e-3)
            self._write(
                {
                    "train_runtime": round(runtime, 4),
                    "train_samples_per_second": round(r.steps * r.global_batch / runtime, 3),
                    "train_steps_per_second": round(r.steps / runtime, 3),
                    "train_loss": train_loss,
                    "epoch": round(self.epochs * r.steps / r.total_steps, 2),
                }
            )
            self.bar.close()
        if r.rank == 0:
            self._info(
                2600,
                "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n",
            )


class NanoGPTFormat(LogFormat):
    name = "nanogpt"

    def preamble(self) -> None:
        r = self.run
        n = r.n_params
        self.c.out(
            f"tokens per iteration will be: {r.tokens_per_step:,}\n"
            "Initializing a new model from scratch\n"
            "defaulting to vocab_size of GPT-2 to 50304 (50257 rounded up for efficiency)\n"
            f"number of parameters: {n / 1e6:.2f}M\n"
            f"num decayed parameter tensors: 50, with {n - 121_344:,} parameters\n"
            "num non-decayed parameter tensors: 98, with 121,344 parameters\n"
            "using fused AdamW: True\n"
            "compiling the model... (takes a ~minute)"
        )
        self.nccl_init()
        self.running_mfu = -1.0
        self.best_val = math.inf

    def step(self, m: StepLog) -> None:
        if m.step - 1 >= 5:  # nanoGPT's local_iter_num >= 5: let the loop settle
            mfu = m.mfu
            self.running_mfu = mfu if self.running_mfu == -1.0 else 0.9 * self.running_mfu + 0.1 * mfu
        if self.run.logs_steps:
            self.c.out(
                f"iter {m.step}: loss {m.loss:.4f}, time {m.step_time_s * 1000:.2f}ms, "
                f"mfu {self.running_mfu * 100:.2f}%"
            )

    def evaluation(self, step: int, eval_loss: float, epoch: float) -> None:
        if not self.run.logs_steps:
            return
        train = eval_loss / 1.015
        self.c.out(f"step {step}: train loss {train:.4f}, val loss {eval_loss:.4f}")
        if eval_loss < self.best_val:
            self.best_val = eval_loss
            self.c.out("saving checkpoint to out")


class TorchTitanFormat(LogFormat):
    name = "torchtitan"

    def __init__(self, run: Run) -> None:
        super().__init__(run)
        self.col = _Colors.ansi() if run.color else _Colors()
        self._last: StepLog | None = None

    def _info(self, text: str) -> None:
        stamp = _now("%Y-%m-%d %H:%M:%S,") + f"{datetime.now().microsecond // 1000:03d}"
        self.c.out(f"[titan] {stamp} - root - INFO - {text}")

    def preamble(self) -> None:
        r = self.run
        talk = r.logs_steps
        if talk:
            for line in (
                "Starting job: Llama 3 debug training",
                f"Building 1-D device mesh with ['dp_shard'], [{r.world}]",
                "[GC] Initial GC collection. 0.00 seconds.",
                "Loading tokenizer from tokenizer.json",
                "Preparing c4 dataset from allenai/c4",
            ):
                self._info(line)
        self.nccl_init()
        if talk:
            pct = 3.77 / GPU_TOTAL_GIB * 100
            for line in (
                f"CUDA capacity: NVIDIA H100 80GB HBM3 with {GPU_TOTAL_GIB:.2f}GiB memory",
                f"Model llama3 debugmodel size: {r.n_params:,} total parameters",
                "Applied selective activation checkpointing to the model",
                "Applied FSDP to the model",
                f"Peak FLOPS used for computing MFU: {r.profile.peak_tflops * 1e12:.3e}",
                f"CUDA memory usage for model: 3.77GiB({pct:.2f}%)",
                f"Training starts at step 1, with local batch size {max(1, r.global_batch // r.world)}, "
                f"global batch size {r.global_batch}, sequence length {SEQ_LEN}, "
                f"total steps {r.total_steps} (warmup {max(1, min(r.total_steps // 20, 2000))})",
            ):
                self._info(line)

    def _memory(self, m: StepLog) -> str:
        c = self.col
        return f"{c.turquoise}memory: {m.mem_gib:5.2f}GiB({m.mem_gib / GPU_TOTAL_GIB * 100:.2f}%)  "

    def step(self, m: StepLog) -> None:
        if not self.run.logs_steps:
            return
        c = self.col
        self._info(
            f"{c.red}step: {m.step:2}  "
            f"{c.green}loss: {m.loss:8.5f}  "
            f"{c.orange}grad_norm: {m.grad_norm:7.4f}  "
            + self._memory(m)
            + f"{c.blue}tps: {round(m.tokens_per_s):,}  "
            f"{c.cyan}tflops: {m.tflops:,.2f}  "
            f"{c.magenta}mfu: {m.mfu * 100:.2f}%{c.reset}"
        )
        self._last = m

    def evaluation(self, step: int, eval_loss: float, epoch: float) -> None:
        if not self.run.logs_steps:
            return
        c = self.col
        m = self._last
        memory = self._memory(m) if m else ""
        tps = round(m.tokens_per_s * 3) if m else 0
        self._info(
            f"{c.yellow}validate step: {step:2}  {c.green}loss: {eval_loss:7.4f}  "
            f"{memory}{c.blue}tps: {tps:,}{c.reset}"
        )

    def finish(self, train_loss: float, runtime_s: float) -> None:
        if self.run.logs_steps:
            self._info("Sleeping 2 seconds for other ranks to complete")
            self._info("Training completed")


class KVFormat(LogFormat):
    name = "kv"

    def preamble(self) -> None:
        r = self.run
        self.c.out(
            f"config: model=tiny-gpt params={r.n_params} lr={r.profile.peak_lr} "
            f"global_batch_size={r.global_batch} seq_len={SEQ_LEN} steps={r.total_steps} "
            f"rank={r.rank} world_size={r.world}"
        )
        self.nccl_init()

    def step(self, m: StepLog) -> None:
        if self.run.logs_steps:
            self.c.out(
                f"step={m.step} loss={m.loss:.4f} lr={m.lr:.3g} grad_norm={m.grad_norm:.4f} "
                f"step_time={m.step_time_s:.4f} tokens_per_s={m.tokens_per_s:.0f}"
            )

    def evaluation(self, step: int, eval_loss: float, epoch: float) -> None:
        if self.run.logs_steps:
            self.c.out(f"step={step} eval_loss={eval_loss:.4f}")

    def finish(self, train_loss: float, runtime_s: float) -> None:
        self.c.out(f"training finished steps={self.run.steps} runtime_s={runtime_s:.1f}")


LOG_FORMATS: dict[str, type[LogFormat]] = {
    cls.name: cls for cls in (MegatronFormat, HFFormat, NanoGPTFormat, TorchTitanFormat, KVFormat)
}


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def train(run: Run) -> int:
    args = run.args
    fmt = LOG_FORMATS[args.format](run)
    curves = Curves(run.profile, run.total_steps, args.seed, run.faults)
    group: FileProcessGroup | None = None
    if args.sync_dir is not None and run.world > 1:
        args.sync_dir.mkdir(parents=True, exist_ok=True)
        numel = min(run.n_params, 40_000_000)
        group = FileProcessGroup(args.sync_dir, run.rank, run.world, args.collective_timeout, numel)
        group.clear_own()
    fmt.preamble()
    loader = FakeDataLoader(run.first_fault_step("hang"))
    losses: list[float] = []
    times: list[float] = []
    all_losses: list[float] = []
    started = time.monotonic()
    for step in range(1, run.steps + 1):
        run.step = step
        t0 = time.monotonic()
        point = train_step(run, loader, group, curves, step)
        dt = time.monotonic() - t0
        losses.append(point.loss)
        times.append(dt)
        all_losses.append(point.loss)
        epoch = fmt.epochs * step / run.total_steps
        if step % args.log_every == 0:
            step_time = _mean(times)
            tps = run.tokens_per_step / run.world / max(step_time, 1e-9)
            tflops = 6 * run.n_params * tps / 1e12
            fmt.step(
                StepLog(
                    step=step,
                    loss=point.loss,
                    loss_avg=_mean(losses),
                    grad_norm=point.grad_norm,
                    lr=point.lr,
                    step_time_s=step_time,
                    nan_iters=sum(1 for v in losses if math.isnan(v)),
                    tokens_per_s=tps,
                    tflops=tflops,
                    mfu=tflops / run.profile.peak_tflops,
                    mem_gib=run.mem_gib + 0.01 * (step % 3),
                    consumed_samples=step * run.global_batch,
                    epoch=epoch,
                )
            )
            losses.clear()
            times.clear()
        if args.eval_every and step % args.eval_every == 0:
            fmt.evaluation(step, point.eval_loss, epoch)
    fmt.finish(_mean(all_losses), time.monotonic() - started)
    return 0


_PG = "[PG ID 0 PG GUID 0(default_pg) Rank {rank}]"
_LIBS = "/usr/local/lib/python3.10/dist-packages/torch/lib"


def _watchdog_frames() -> str:
    return "\n".join(
        [
            "Exception raised from checkTimeout at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:618 "
            "(most recent call first):",
            "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 "
            f"(0x7f3a1c1b9446 in {_LIBS}/libc10.so)",
            "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration"
            f"<long, std::ratio<1l, 1000l> > >) + 0x282 (0x7f3a1d4b2772 in {_LIBS}/libtorch_cuda.so)",
            "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 "
            f"(0x7f3a1d4b9bb3 in {_LIBS}/libtorch_cuda.so)",
            "frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d "
            f"(0x7f3a1d4bb61d in {_LIBS}/libtorch_cuda.so)",
            f"frame #4: <unknown function> + 0x145c0 (0x7f3a6a0f45c0 in {_LIBS}/libtorch.so)",
            "frame #5: <unknown function> + 0x94ac3 (0x7f3a6bc94ac3 in /lib/x86_64-linux-gnu/libc.so.6)",
            "frame #6: <unknown function> + 0x126850 (0x7f3a6bd26850 in /lib/x86_64-linux-gnu/libc.so.6)",
            "",
        ]
    )


def print_watchdog_timeout(run: Run, exc: CollectiveTimeout) -> None:
    """The text torch's NCCL watchdog prints before it takes the process down."""
    rank = run.rank
    now = time.time()
    when = datetime.fromtimestamp(now)
    ns = int(now % 1 * 1e9)
    seq = exc.seq
    work = (
        f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={exc.numel}, NumelOut={exc.numel}, "
        f"Timeout(ms)={int(exc.timeout_s * 1000)})"
    )
    caught = (
        f"[Rank {rank}] Watchdog caught collective operation timeout: {work} ran for "
        f"{int(exc.ran_s * 1000)} milliseconds before timing out."
    )
    pg = _PG.format(rank=rank)
    works = f"last enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}."
    terminated = f"{pg} Process group watchdog thread terminated with exception: {caught}"
    lines = [
        (616, caught),
        (1785, f"{pg} Exception (either an error or timeout) detected by watchdog at work: {seq}, {works}"),
        (1834, f"{pg} Timeout at NCCL work: {seq}, {works}"),
        (
            630,
            f"[Rank {rank}] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
            "of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        ),
        (636, f"[Rank {rank}] To avoid data inconsistency, we are taking the entire process down."),
        (1595, terminated),
    ]
    text = "\n".join(
        f"[rank{rank}]:[E{when.month}{when.day:02d} {when:%H:%M:%S}.{min(ns + 23_117 * i, 999_999_999):09d} "
        f"ProcessGroupNCCL.cpp:{line}] {msg}"
        for i, (line, msg) in enumerate(lines)
    )
    run.console.err(
        f"{text}\n{_watchdog_frames()}\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  {terminated}\n{_watchdog_frames()}"
    )


def _env_int(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return default


def _fault_arg(text: str) -> Fault:
    try:
        return Fault.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rankwatch.demo.trainer",
        description="A fake training rank that prints real framework logs and injects faults.",
    )
    p.add_argument("--rank", type=int, default=_env_int("RANK", default=0))
    p.add_argument("--world-size", type=int, default=_env_int("WORLD_SIZE", default=1))
    p.add_argument("--local-rank", type=int, default=_env_int("LOCAL_RANK", default=-1))
    p.add_argument("--steps", type=int, default=300, help="steps to run")
    p.add_argument("--total-steps", type=int, default=None, help="denominator printed (default: --steps)")
    p.add_argument("--step-time", type=float, default=0.05, help="seconds of work per step")
    p.add_argument("--busy", action="store_true", help="burn CPU during a step instead of sleeping")
    p.add_argument("--format", choices=FORMATS, default="megatron")
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=0, help="0: no evaluation")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--sync-dir", type=Path, default=None, help="folder for the file-based all_reduce")
    p.add_argument("--collective-timeout", type=float, default=600.0, help="seconds (NCCL default 600)")
    p.add_argument("--tokens-per-step", type=int, default=65536, help="global tokens per step")
    p.add_argument(
        "--fault",
        action="append",
        type=_fault_arg,
        default=[],
        metavar="KIND@STEP[:rank=R]",
        help=f"inject a fault; KIND one of {', '.join(FAULT_KINDS)}",
    )
    p.add_argument(
        "--all-ranks-log",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every rank prints step lines (--no-all-ranks-log: only the rank the framework uses)",
    )
    p.add_argument("--prefix-rank", action="store_true", help="prefix lines with [rankN]: like torchrun")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.world_size < 1 or not 0 <= args.rank < args.world_size:
        parser.error(f"--rank {args.rank} is not in a world of size {args.world_size}")
    if args.steps < 0 or args.step_time < 0 or args.log_every < 1 or args.eval_every < 0:
        parser.error("--steps, --step-time, --eval-every must be >= 0 and --log-every >= 1")
    if args.tokens_per_step < 1 or args.collective_timeout <= 0:
        parser.error("--tokens-per-step and --collective-timeout must be positive")
    if args.local_rank is not None and args.local_rank < 0:
        args.local_rank = None
    return args


def _uncaught_traceback(exc: BaseException, caller: FrameType | None) -> str:
    """The traceback Python would print had the error escaped the script's ``main()`` call."""
    outer = [f for f in traceback.extract_stack(caller) if f.filename == __file__] if caller else []
    inner = traceback.extract_tb(exc.__traceback__)
    text = "Traceback (most recent call last):\n"
    text += "".join(traceback.StackSummary.from_list([*outer, *inner]).format())
    text += "".join(traceback.format_exception_only(type(exc), exc))
    return text[:-1] if text.endswith("\n") else text


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    run = Run(parse_args(argv))
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        return train(run)
    except Terminated:
        run.console.err(f"[rank{run.rank}] Received SIGTERM at step {run.step}, terminating training")
        return 143
    except CollectiveTimeout as exc:
        print_watchdog_timeout(run, exc)
        return 134
    except FaultExit as exc:
        return exc.code
    except InjectedFailure as exc:
        run.console.err(_uncaught_traceback(exc, sys._getframe(1)))
        return 1
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
