"""A real two-rank DDP training loop on gloo that prints nanoGPT's exact lines.

Usage: ``python gen_ddp.py SCENARIO OUT_DIR``. Both ranks write to ``OUT_DIR/SCENARIO.log``
(as torchrun's console does; nanoGPT prints on the master rank only) the lines of
nanoGPT's ``train.py``: ``step N: train loss X, val loss Y`` at each evaluation and
``iter N: loss X, time Yms, mfu Z%`` each iteration (mfu -100.00% until the fifth, as
nanoGPT's running estimate starts at -1). ``OUT_DIR/SCENARIO.json`` holds the truth.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

SCENARIOS: dict[str, dict[str, Any]] = {
    "nanogpt_ddp": {"max_iters": 80, "eval_interval": 20},
    "nanogpt_ddp_nan40": {"max_iters": 80, "eval_interval": 20, "nan_at": 40},
}


def _rank(rank: int, world: int, port: int, name: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    spec = SCENARIOS[name]
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    master = rank == 0
    torch.manual_seed(1337 + rank)
    vocab, block, emb = 65, 16, 32
    model = torch.nn.Sequential(
        torch.nn.Embedding(vocab, emb),
        torch.nn.Linear(emb, emb),
        torch.nn.GELU(),
        torch.nn.Linear(emb, vocab),
    )
    torch.manual_seed(0)
    for p in model.parameters():  # the same start on every rank, as DDP broadcasts
        torch.nn.init.normal_(p, std=0.1)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-3)
    data = torch.randint(0, vocab, (4096,), generator=torch.Generator().manual_seed(rank))
    n_params = sum(p.numel() for p in model.parameters())

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(data) - block - 1, (8,))
        x = torch.stack([data[i : i + block] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + block] for i in ix])
        return x, y

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(ddp(x).view(-1, vocab), y.view(-1))

    nan_at = spec.get("nan_at")
    running_mfu = -1.0
    logged: list[int] = []
    nan_iter = None
    t0 = time.time()
    for iter_num in range(spec["max_iters"] + 1):
        if iter_num % spec["eval_interval"] == 0 and master:
            with torch.no_grad():
                losses = {k: float(loss_of(*batch())) for k in ("train", "val")}
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if nan_at is not None and iter_num == nan_at:
            with torch.no_grad():
                model[1].weight.fill_(float("nan"))
        loss = loss_of(*batch())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if master:
            lossf = loss.item()
            if iter_num >= 5:
                mfu = 6 * n_params * 8 * block / dt / 1e12
                running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%")
            logged.append(iter_num)
            if nan_iter is None and not math.isfinite(lossf):
                nan_iter = iter_num
    sys.stdout.flush()
    if master:
        truth = {
            "scenario": name,
            "format": "nanogpt",
            "total_steps": spec["max_iters"],
            "logged_steps": logged,
            "nan_step": nan_iter,
            "healthy": nan_at is None,
            "blowup": False,
        }
        Path(out_dir, f"{name}.json").write_text(json.dumps(truth, indent=1))
    dist.destroy_process_group()


def main(name: str, out_dir: str) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(2, port, name, out_dir), nprocs=2, join=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
