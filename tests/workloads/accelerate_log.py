"""A real accelerate job (CPU, gloo) logging through accelerate's own logger.

``accelerate launch --multi_gpu --num_processes 2 accelerate_log.py``: an ``Accelerator`` and
``accelerate.logging.get_logger``, each process logging ``step N: loss X lr 0.01`` with
``main_process_only=False``, so accelerate marks every message ``[RANK n]`` and both processes'
lines share the launcher's one output. ``FAULT=nan``: process ``FAULT_RANK``'s loss is NaN
from ``FAULT_STEP`` (DDP spreads it to the others a step later). Derived from the black-box
batch s36's scripts/acc3.py.
"""

from __future__ import annotations

import logging
import os
import time

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger

logging.basicConfig(
    format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
    datefmt="%m/%d/%Y %H:%M:%S",
    level=logging.INFO,
)
log = get_logger(__name__)
FAULT = os.environ.get("FAULT", "none")
FAULT_STEP = int(os.environ.get("FAULT_STEP", "15"))
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
STEPS = int(os.environ.get("STEPS", "25"))


def main() -> None:
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(1024, 8)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, opt, loader = acc.prepare(model, opt, loader)
    rank = acc.process_index
    for step, (a, b) in enumerate(loader, 1):
        if step > STEPS:
            break
        loss = torch.nn.functional.mse_loss(model(a), b)
        if FAULT == "nan" and rank == FAULT_RANK and step >= FAULT_STEP:
            loss = loss * float("nan")
        opt.zero_grad()
        acc.backward(loss)
        opt.step()
        log.info(f"step {step}: loss {loss.item():.5f} lr 0.01", main_process_only=False)
        time.sleep(float(os.environ.get("STEP_S", "0.05")))
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
