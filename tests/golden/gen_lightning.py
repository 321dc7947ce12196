"""Run a real PyTorch Lightning ``Trainer`` on CPU and keep what it printed, with its truth.

Usage: ``python gen_lightning.py SCENARIO OUT_DIR``. Writes ``OUT_DIR/SCENARIO.log`` (the
progress bar and everything else on stdout and stderr, one file), the ``CSVLogger``'s
``metrics.csv`` as ``OUT_DIR/SCENARIO.metrics.csv`` and ``OUT_DIR/SCENARIO.json`` (the
global steps the trainer logged, its total). A tiny model on random data, seconds per run.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any

SCENARIOS: dict[str, dict[str, Any]] = {
    # 3 epochs of 18 batches, the loss on the tqdm bar, validation each epoch.
    "lightning_tqdm": {"epochs": 3, "batches": 18, "bar": "tqdm"},
    # NaN injected before the 30th optimizer step (CSV step 29, bar step 30).
    "lightning_tqdm_nan30": {"epochs": 3, "batches": 18, "nan_at": 30, "bar": "tqdm"},
    # The default bar when rich is installed: on a file it prints its last frame only.
    "lightning_rich": {"epochs": 3, "batches": 18, "bar": "rich"},
}


def main(name: str, out_dir: str) -> None:
    spec = SCENARIOS[name]
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    nan_at = spec.get("nan_at")

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

        def training_step(self, batch: Any, idx: int) -> torch.Tensor:
            if nan_at is not None and self.global_step == nan_at - 1 and idx >= 0:
                with torch.no_grad():
                    self.net[0].weight.fill_(float("nan"))
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def validation_step(self, batch: Any, idx: int) -> None:
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y), prog_bar=True)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    n = spec["batches"] * 4
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g))
    val = TensorDataset(torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g))
    out = Path(out_dir)
    logs = out / f"{name}.csvlogs"
    trainer = L.Trainer(
        max_epochs=spec["epochs"],
        accelerator="cpu",
        devices=1,
        logger=CSVLogger(str(logs), name="", version=0),
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[TQDMProgressBar(refresh_rate=1) if spec["bar"] == "tqdm" else RichProgressBar()],
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=4), DataLoader(val, batch_size=8))
    sys.stdout.flush()
    sys.stderr.flush()
    csv = next(logs.rglob("metrics.csv"))
    shutil.copy(csv, out / f"{name}.metrics.csv")
    shutil.rmtree(logs, ignore_errors=True)
    rows = [r.split(",") for r in csv.read_text().splitlines()] if csv.exists() else []
    truth_rows = (out / f"{name}.metrics.csv").read_text().splitlines()
    head = truth_rows[0].split(",")
    logged, nan_step = [], None
    for row in truth_rows[1:]:
        cells = dict(zip(head, row.split(","), strict=False))
        if cells.get("train_loss"):
            step = int(cells["step"])
            logged.append(step)
            if nan_step is None and not math.isfinite(float(cells["train_loss"])):
                nan_step = step
    del rows
    truth = {
        "scenario": name,
        "format": "lightning",
        "total_steps": int(trainer.global_step),
        "logged_steps": logged,
        "nan_step": nan_step,
        "healthy": nan_at is None,
        "blowup": False,
        "batches_per_epoch": spec["batches"],
        "epochs": spec["epochs"],
    }
    (out / f"{name}.json").write_text(json.dumps(truth, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
