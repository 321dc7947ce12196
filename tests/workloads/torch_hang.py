"""A real 2-rank gloo job: rank 1 blocks before an all_reduce, so rank 0 hangs inside it."""

from __future__ import annotations

import os
import threading
import time

import torch
import torch.distributed as dist

HANG_STEP = int(os.environ.get("HANG_STEP", "30"))


def wait_for_peer_data() -> None:
    threading.Event().wait()


def train_step(step: int, t: torch.Tensor) -> float:
    dist.all_reduce(t)
    return 2.0 / step


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(16)
    for step in range(1, 1_000_000):
        if rank == 1 and step == HANG_STEP:
            wait_for_peer_data()
        loss = train_step(step, t)
        print(f"step={step} loss={loss:.4f} lr=1e-4", flush=True)
        time.sleep(0.02)


if __name__ == "__main__":
    main()
