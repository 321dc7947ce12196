"""A real Lightning DDP job on CPU whose ranks Lightning starts itself.

``Trainer(strategy="ddp", accelerator="cpu", devices=2)`` run as ``python lightning_ddp.py``:
Lightning's ``_SubprocessScriptLauncher`` runs this script again for local rank 1 (with
``LOCAL_RANK``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``; no RANK) and
the first process is rank 0. A Linear(8, 1) model on random data, ``STEPS`` optimizer steps.

``FAULT=oom``: global rank ``FAULT_RANK`` raises torch.OutOfMemoryError (CUDA's text; this CPU
job can only raise it) in its training step at ``global_step == FAULT_STEP``; its peer's next
all-reduce then fails with gloo's "Connection closed by peer". ``FAULT=hang``: that rank sleeps
forever in its training step instead (its peer waits in DDP's all-reduce of the backward).
"""

from __future__ import annotations

import os
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "10"))
STEPS = int(os.environ.get("STEPS", "15"))


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if FAULT == "oom" and self.global_rank == FAULT_RANK and self.global_step == FAULT_STEP:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 12.00 GiB. GPU 1 has a total capacity of 79.15 GiB "
                "of which 2.10 GiB is free."
            )
        if FAULT == "hang" and self.global_rank == FAULT_RANK and self.global_step == FAULT_STEP:
            while True:
                time.sleep(0.5)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(STEPS * 2 * 8, 8)
    trainer = L.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_steps=STEPS,
        log_every_n_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
