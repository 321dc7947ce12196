"""A real DDP job (CPU, gloo) launched by ``torch.multiprocessing.spawn`` from one script, as many
single-node scripts do: each child sets RANK/WORLD_SIZE in ``os.environ`` itself, so no rank is in
any process's environment as the kernel shows it (/proc/<pid>/environ).

``FAULT=hang`` on ``FAULT_RANK`` from ``FAULT_STEP``: that rank sleeps forever in the training
loop (a rank stuck in its own code); its peer blocks in DDP's gradient all-reduce.
``FAULT=cpuoom``: that rank asks the CPU allocator for 256 TiB, which fails at once (PyTorch's
``DefaultCPUAllocator: can't allocate memory``), and the launcher re-raises it. ``FAULT=sigkill``:
that rank kills itself with SIGKILL (as the host's OOM killer would), printing nothing. Steps every
``STEP_S`` seconds, logging ``step=N loss=X rank=R`` lines.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "-1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "5"))
STEPS = int(os.environ.get("STEPS", "1000000"))
STEP_S = float(os.environ.get("STEP_S", "0.05"))


def train(rank: int, world: int) -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, STEPS + 1):
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        if FAULT == "hang" and rank == FAULT_RANK and step >= FAULT_STEP:
            while True:
                time.sleep(1)
        if FAULT == "sigkill" and rank == FAULT_RANK and step >= FAULT_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        if FAULT == "cpuoom" and rank == FAULT_RANK and step >= FAULT_STEP:
            torch.empty(1 << 46, dtype=torch.float32)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sys.stdout.write(f"step={step} loss={loss.item():.5f} rank={rank}\n")
        sys.stdout.flush()
        time.sleep(STEP_S)
    dist.destroy_process_group()


def worker(rank: int, world: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    sys.stdout.write(f"worker rank {rank} pid {os.getpid()}\n")  # the test's ground truth
    sys.stdout.flush()
    train(rank, world)


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    mp.spawn(worker, args=(int(os.environ.get("NPROCS", "2")),), nprocs=int(os.environ.get("NPROCS", "2")))
