"""A real DDP job (CPU, gloo) whose faults are chosen from the environment.

A tiny causal "transformer block" with a registered buffer (the causal mask), so DDP
broadcasts buffers before every forward (``_sync_buffers``), fed by a DataLoader with one
worker process, stepping every ~50 ms and logging ``step=N loss=X`` lines.

Faults (``FAULT``, on rank ``FAULT_RANK`` from step ``FAULT_STEP``):
  loader_hang  the DataLoader worker blocks forever in ``__getitem__``;
  loader_hang_once  the same, in torchrun's first attempt only (``PG_TIMEOUT_S``, gloo's
               timeout, then ends the hang and torchrun's restart runs clean);
  barrier      an extra ``dist.barrier()`` the other ranks never call;
  sigkill      the rank kills itself with SIGKILL (the OOM killer);
  oom          the rank raises torch.OutOfMemoryError (CUDA's text) and exits;
  slow         each step computes ``SLOW_FACTOR`` x longer (a straggler);
  nan          the rank's inputs become NaN, so its real loss is NaN from then on;
  raise        the rank raises a RuntimeError, in the first attempt only (a torchrun restart
               runs on: ``TORCHELASTIC_RESTART_COUNT``);
  raise_then_nan  raise in the first attempt, and after torchrun's restart NaN inputs from
               the same step (what the restarted worker prints shows where it is read from);
  raise_always the rank raises a RuntimeError in every attempt (torchrun's restarts run out);
  raise_all    every rank raises a RuntimeError at the same step, in every attempt; with a
               FAULT_RANK all others are slow to exit after it, so the launcher stops them;
  raise_slow_exit  the rank raises a RuntimeError, closes its process group and is slow to
               exit (the g58 race of the s38 tester): its peers lose it and end at once on
               their error, so the launcher sees a consequence first and stops this rank;
  hang_init    the rank sleeps before ``init_process_group`` (its peers wait inside it);
  exit         the rank returns from ``main`` with exit status 0 while its peers go on;
  sysexit      the rank prints an ``ERROR: ...`` line on stderr and calls ``sys.exit(3)`` (no
               traceback: a script's own check that gives up);
  abort        the rank calls ``os.abort()`` (SIGABRT, no traceback: a C++ assertion);
  save_hang    the rank saves a checkpoint (``torch.save`` into ``CKPT_DIR``) whose writes
               stop after the first bytes, as on a hung NFS server: it hangs inside torch.save;
  none         healthy.
``LOG_RANKS`` (comma-separated): only these ranks print their step lines, as HF Trainer and
Megatron log on one rank only (default: every rank).
``GRAD_NORM=1``: each step line carries the total gradient norm after the backward all-reduce
(``grad_norm=X``, as HF and Megatron log it).
``SAY_RANK=1``: each step line ends with ``rank=N``, as scripts that print into the one log of a
plain torchrun job do (tests/data/blackbox/s37/scripts/t4.py: ``step=39 loss=2.94673 lr=0.01
rank=1``). ``FAULT_GATE``: a file; the fault waits for it to exist (from ``FAULT_STEP`` on), so a
test can attach an agent mid-run and have the rank fail only after that.
Rank identity comes from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR/PORT); under a plain
``srun -n N python ddp_train.py`` from Slurm's (SLURM_PROCID, SLURM_NTASKS), set in the process
as such scripts do, so its environment as /proc shows it holds Slurm's variables only.
``DIST=0`` runs each rank alone (no process group, no DDP): the cheapest real job for what
is about the launcher and not the collectives (the node daemon's jobs).
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import io
import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "-1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "20"))
STEPS = int(os.environ.get("STEPS", "1000000"))
STEP_S = float(os.environ.get("STEP_S", "0.05"))
SLOW_FACTOR = float(os.environ.get("SLOW_FACTOR", "3"))
LOG_RANKS = {int(r) for r in os.environ.get("LOG_RANKS", "").split(",") if r.strip()}
SAY_RANK = os.environ.get("SAY_RANK", "0") == "1"
FAULT_GATE = os.environ.get("FAULT_GATE")
GRAD_NORM = os.environ.get("GRAD_NORM", "0") == "1"
GRAD_NORM_SEEN = 0.0
# DataLoader worker processes per rank. A worker is forked after init_process_group and holds
# its rank's gloo sockets open until it notices its parent is gone (up to 5 s): with 0 a killed
# rank's connections close at once, and its peer's gloo error comes before a launcher stops it.
LOADER_WORKERS = int(os.environ.get("LOADER_WORKERS", "1"))
SEQ, DIM, BATCH = 16, 32, 8


class CausalBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.out = nn.Linear(DIM, DIM)
        self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ)).bool())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        att = (q @ k.transpose(-2, -1)) / DIM**0.5
        att = att.masked_fill(~self.mask, float("-inf")).softmax(-1)
        return self.out(att @ v)


class Tokens(Dataset):
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        hangs = FAULT == "loader_hang" or (FAULT == "loader_hang_once" and first_attempt)
        if hangs and self.rank == FAULT_RANK and i >= FAULT_STEP * BATCH:
            read_shard_forever()
        g = torch.Generator().manual_seed(i)
        x = torch.randn(SEQ, DIM, generator=g)
        return x, x.roll(1, 0)


def read_shard_forever() -> None:
    """A worker stuck reading its shard (a hung NFS read, a lock never released)."""
    threading.Event().wait()


def compute(model: nn.Module, x: torch.Tensor, y: torch.Tensor, slow: float) -> torch.Tensor:
    loss = F.mse_loss(model(x), y)
    # The "real work" of a step: a sleep stands in for GPU kernels, which ranks do not share.
    time.sleep(STEP_S * slow)
    return loss


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, slow: float):
    global GRAD_NORM_SEEN
    opt.zero_grad()
    loss = compute(model, x, y, slow)
    loss.backward()
    if GRAD_NORM:
        GRAD_NORM_SEEN = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
    opt.step()
    return loss


def allocate_activations(step: int) -> None:
    """A CUDA OOM as PyTorch's caching allocator words it (this CPU job can only raise it)."""
    raise torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 3.91 GiB. GPU 1 has a total capacity of 79.15 GiB of which "
        "1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use. Of the "
        "allocated memory 74.31 GiB is allocated by PyTorch, and 2.87 GiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


class StuckFile(io.RawIOBase):
    """A checkpoint file whose disk stops answering after its first write (a hung NFS server)."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "wb")  # noqa: SIM115 - held open while it hangs
        self.n = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def,override]
        if self.n:
            threading.Event().wait()
        self.n += 1
        self.f.write(b)
        self.f.flush()
        return len(b)


def save_checkpoint(model: nn.Module, step: int) -> None:
    torch.save(model.state_dict(), StuckFile(os.path.join(os.environ["CKPT_DIR"], f"ckpt_step{step}.pt")))


def say(line: str) -> None:
    """One line in one write(2). Under PYTHONUNBUFFERED=1 ``print`` writes the text and its
    newline in two, and workers sharing torchrun's stdout pipe (no --tee) then interleave
    mid-line: ``step=12 loss=1.05 ...step=12 loss=nan ...`` on one line, the NaN hidden behind
    its peer's record. A write of up to PIPE_BUF bytes to a pipe is atomic."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def sync_metrics() -> None:
    """An extra barrier that only one rank takes: a collective mismatch."""
    dist.barrier()


def hang_up_peers() -> None:
    """Shut this process's TCP connections down (gloo's pairs among them): its peers see
    "Connection closed by peer" at once, as when a process's sockets close at its end."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                s = socket.socket(fileno=int(name))
                with contextlib.suppress(OSError):
                    if not s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):  # not a listener
                        s.shutdown(socket.SHUT_RDWR)
                s.detach()
        except (OSError, ValueError):
            pass


def main() -> None:
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_NTASKS"])
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    alone = os.environ.get("DIST", "1") == "0"
    if alone:
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    else:
        if FAULT == "hang_init" and int(os.environ.get("RANK", "-1")) == FAULT_RANK:
            threading.Event().wait()  # a rank that never reaches the rendezvous
        # PG_TIMEOUT_S: gloo's own timeout (torch's default 30 min), which ends a hang as a crash.
        timeout = os.environ.get("PG_TIMEOUT_S")
        if timeout:
            dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(timeout)))
        else:
            dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model: nn.Module = CausalBlock() if alone else DDP(CausalBlock())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(
        Tokens(rank),
        batch_size=BATCH,
        num_workers=LOADER_WORKERS,
        prefetch_factor=1 if LOADER_WORKERS else None,
    )
    say(f"rank {rank}/{world} pid {os.getpid()} starting")
    for step, (x, y) in enumerate(loader, 1):
        faulty = rank == FAULT_RANK and step >= FAULT_STEP and (not FAULT_GATE or os.path.exists(FAULT_GATE))
        if faulty and FAULT == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if faulty and FAULT == "abort":
            os.abort()
        if faulty and FAULT == "oom":
            allocate_activations(step)
        if faulty and FAULT == "barrier" and step == FAULT_STEP:
            sync_metrics()
        restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
        if faulty and (FAULT == "nan" or (FAULT == "raise_then_nan" and restarted)):
            x = x * float("nan")
        if faulty and FAULT in ("raise", "raise_then_nan") and not restarted:
            raise RuntimeError(f"rank {rank} hit a bad batch at step {step}")
        if faulty and FAULT == "raise_always":
            raise RuntimeError(f"rank {rank} hit a bad batch at step {step}")
        if FAULT == "raise_all" and step >= FAULT_STEP:
            if 0 <= FAULT_RANK != rank:
                # A slow teardown after the traceback (DataLoader workers joining, a process
                # group's shutdown): the launcher sees FAULT_RANK's exit first and stops this one.
                atexit.register(time.sleep, 30)
            raise RuntimeError(f"rank {rank} hit a bad batch at step {step}")
        if faulty and FAULT == "raise_slow_exit":
            try:
                raise RuntimeError(f"rank {rank} hit a bad batch at step {step}")
            except RuntimeError:
                sys.excepthook(*sys.exc_info())  # what an uncaught error prints (torch's hook)
            hang_up_peers()  # the peers lose it...
            time.sleep(30)  # ...while its end is slow (an upload, a logger's flush)
            sys.exit(1)
        if faulty and FAULT == "save_hang":
            save_checkpoint(model, step)
        if faulty and FAULT == "sysexit":
            sys.stderr.write(f"ERROR: tokenizer vocab mismatch on rank {rank} at step {step}; aborting\n")
            sys.stderr.flush()
            sys.exit(3)
        if faulty and FAULT == "exit":
            say(f"rank {rank} leaves early at step {step}")
            return
        slow = SLOW_FACTOR if faulty and FAULT == "slow" else 1.0
        t0 = time.perf_counter()
        loss = train_step(model, opt, x, y, slow)
        dt = time.perf_counter() - t0
        if not LOG_RANKS or rank in LOG_RANKS:
            said = f" rank={rank}" if SAY_RANK else ""
            gn = f" grad_norm={GRAD_NORM_SEEN:.4f}" if GRAD_NORM else ""
            say(f"step={step} loss={loss.item():.4f}{gn} lr=1e-3 step_time={dt:.4f}{said}")
        if step >= STEPS:
            break
    if not alone:
        dist.destroy_process_group()


if __name__ == "__main__":
    if FAULT == "raise_slow_exit" and int(os.environ.get("RANK", "-1")) != FAULT_RANK:
        # The peers end at once on their error, skipping a teardown that could wait for the
        # failed rank (scripts that call os._exit so, to never hang in a process group's end).
        try:
            main()
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    else:
        main()
