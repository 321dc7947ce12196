# Lightning DDP on CPU (Lightning starts its other rank itself). BAR=tqdm|rich. FAULT=nan|crash|hang on global rank 1 at FAULT_STEP.
import os, time, torch, lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar, RichProgressBar
from torch.utils.data import DataLoader, TensorDataset
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "10"))
class M(L.LightningModule):
    def __init__(self): super().__init__(); self.l = torch.nn.Linear(8, 1)
    def training_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y)
        if self.global_rank == 1 and self.global_step >= FS and F == "nan": loss = loss * float("nan")
        if self.global_rank == 1 and self.global_step == FS and F == "crash": raise RuntimeError(f"injected failure at global step {self.global_step}")
        if self.global_rank == 1 and self.global_step == FS and F == "hang":
            while True: time.sleep(1)
        time.sleep(0.1)
        self.log("train_loss", loss, prog_bar=True); return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)
if __name__ == "__main__":
    x = torch.randn(512, 8); ds = TensorDataset(x, x.sum(1, keepdim=True))
    bar = TQDMProgressBar(refresh_rate=1) if os.environ.get("BAR", "tqdm") == "tqdm" else RichProgressBar()
    t = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=1, log_every_n_steps=1, logger=False,
                  enable_checkpointing=False, callbacks=[bar])
    t.fit(M(), DataLoader(ds, batch_size=8))
