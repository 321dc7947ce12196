# Lightning 2.6 DDP on CPU (Lightning starts its other rank itself), RichProgressBar, batch s38. Env:
#  FAULT=none|anomaly (Trainer(detect_anomaly=True); global rank 1's loss NaN at FAULT_STEP -> autograd anomaly RuntimeError)|nan
#  CSV=1: CSVLogger(save_dir=.) every step; CKPT=1: ModelCheckpoint every 5 steps (save_top_k=-1); STEPS
import os, time, torch, lightning as L
from lightning.pytorch.callbacks import RichProgressBar, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "10"))
class M(L.LightningModule):
    def __init__(self): super().__init__(); self.l = torch.nn.Linear(8, 1)
    def training_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y)
        if self.global_rank == 1 and self.global_step >= FS and F in ("anomaly", "nan"): loss = loss * float("nan")
        time.sleep(0.1)
        self.log("train_loss", loss, prog_bar=True); return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)
if __name__ == "__main__":
    torch.manual_seed(0); x = torch.randn(4096, 8); ds = TensorDataset(x, x.sum(1, keepdim=True))
    cbs = [RichProgressBar()]
    if os.environ.get("CKPT"): cbs.append(ModelCheckpoint(dirpath="ckpts", every_n_train_steps=5, save_top_k=-1, filename="{step}"))
    t = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_steps=int(os.environ.get("STEPS", "30")), log_every_n_steps=1,
                  logger=CSVLogger(".", name="csv") if os.environ.get("CSV") else False, detect_anomaly=(F == "anomaly"),
                  enable_checkpointing=bool(os.environ.get("CKPT")), callbacks=cbs)
    t.fit(M(), DataLoader(ds, batch_size=8))
    print(f"rank {t.global_rank} done", flush=True)
