# Lightning 2.6 DDP on CPU, Lightning starts its other ranks itself (DEVICES, default 3), default TQDM bar, fit then validate.
#  FAULT=none|oom (global rank FAULT_RANK raises torch.OutOfMemoryError in training_step at global step FAULT_STEP)
#       |crash_val (global rank FAULT_RANK raises ValueError in validation_step during trainer.validate after fit)|nan
#  STEPS; the step lines: self.log(prog_bar) and a print "step=N loss=X rank=R" from training_step
import os, time, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "10")); FR = int(os.environ.get("FAULT_RANK", "1"))
class M(L.LightningModule):
    def __init__(self): super().__init__(); self.l = torch.nn.Linear(8, 1)
    def training_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y)
        if self.global_rank == FR and self.global_step >= FS and F == "nan": loss = loss * float("nan")
        if self.global_rank == FR and self.global_step == FS and F == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity of 79.10 GiB of which 1.02 GiB is free.")
        time.sleep(0.15)
        self.log("train_loss", loss, prog_bar=True)
        print(f"step={self.global_step} loss={loss.item():.5f} rank={self.global_rank}", flush=True)
        return loss
    def validation_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y)
        if F == "crash_val" and self.global_rank == FR and i == 3:
            raise ValueError(f"validation batch {i}: label shape mismatch on rank {self.global_rank}")
        self.log("val_loss", loss, sync_dist=True)
        return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)
if __name__ == "__main__":
    torch.manual_seed(0); x = torch.randn(4096, 8); ds = TensorDataset(x, x.sum(1, keepdim=True))
    v = TensorDataset(x[:256], x[:256].sum(1, keepdim=True))
    t = L.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ.get("DEVICES", "3")), max_steps=int(os.environ.get("STEPS", "30")),
                  log_every_n_steps=1, logger=False, enable_checkpointing=False, limit_val_batches=8, val_check_interval=None, check_val_every_n_epoch=None)
    m = M()
    t.fit(m, DataLoader(ds, batch_size=8))
    t.validate(m, DataLoader(v, batch_size=8))
    print(f"rank {t.global_rank} done", flush=True)
