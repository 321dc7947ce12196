# Lightning 2.6 DDP on CPU, Lightning starts its other ranks itself (DEVICES, default 2). Batch s40. Env:
#  FAULT=none|hang_val (global rank FAULT_RANK sleeps forever in validation_step at the first validation at/after FAULT_STEP)
#       |nan (global rank FAULT_RANK's loss NaN from global step FAULT_STEP)
#  MAXTIME (Trainer(max_time="00:00:00:SS"), max_steps -1), STEPS, VAL_EVERY (val_check_interval in steps; 0 none), CKPT_EVERY (ModelCheckpoint every n steps into ckpts/)
#  PRINT=0: no print lines (only self.log to the progress bar and a CSVLogger), LOG_EVERY (log_every_n_steps)
import os, time, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "10")); FR = int(os.environ.get("FAULT_RANK", "1"))
PR = os.environ.get("PRINT", "1") == "1"
class M(L.LightningModule):
    def __init__(self): super().__init__(); self.l = torch.nn.Linear(8, 1)
    def training_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y)
        if self.global_rank == FR and self.global_step >= FS and F == "nan": loss = loss * float("nan")
        time.sleep(0.15)
        self.log("train_loss", loss, prog_bar=True)
        if PR: print(f"step={self.global_step} loss={loss.item():.5f} rank={self.global_rank}", flush=True)
        return loss
    def validation_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y)
        if F == "hang_val" and self.global_rank == FR and self.global_step >= FS:
            print(f"rank {self.global_rank} validation batch {i}: waiting for the eval shard", flush=True)
            while True: time.sleep(1)
        self.log("val_loss", loss, sync_dist=True)
        return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)
if __name__ == "__main__":
    torch.manual_seed(0); x = torch.randn(200000, 8); ds = TensorDataset(x, x.sum(1, keepdim=True))
    v = TensorDataset(x[:64], x[:64].sum(1, keepdim=True))
    cb = []
    if int(os.environ.get("CKPT_EVERY", "0")):
        from lightning.pytorch.callbacks import ModelCheckpoint
        cb.append(ModelCheckpoint(dirpath="ckpts", every_n_train_steps=int(os.environ["CKPT_EVERY"]), save_top_k=-1))
    ve = int(os.environ.get("VAL_EVERY", "0"))
    mt = os.environ.get("MAXTIME")
    logger = False
    if not PR:
        from lightning.pytorch.loggers import CSVLogger
        logger = CSVLogger("csv")
    t = L.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ.get("DEVICES", "2")),
                  max_steps=-1 if mt else int(os.environ.get("STEPS", "30")), max_time=f"00:00:00:{mt}" if mt else None, max_epochs=-1 if mt else None,
                  log_every_n_steps=int(os.environ.get("LOG_EVERY", "1")), logger=logger, enable_checkpointing=bool(cb), callbacks=cb,
                  limit_val_batches=4 if ve else 0, val_check_interval=ve or None, check_val_every_n_epoch=None if ve else 1, num_sanity_val_steps=0)
    m = M()
    t.fit(m, DataLoader(ds, batch_size=8), DataLoader(v, batch_size=8) if ve else None)
    print(f"rank {t.global_rank} done at step {t.global_step}", flush=True)
