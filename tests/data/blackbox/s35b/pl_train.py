# Lightning DDP on CPU, 2 processes launched by Lightning itself; OOM injected on global rank 1
import os, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
class M(L.LightningModule):
    def __init__(self): super().__init__(); self.l = torch.nn.Linear(8, 1)
    def training_step(self, b, i):
        x, y = b; loss = torch.nn.functional.mse_loss(self.l(x), y)
        fs = int(os.environ.get("FAULT_STEP", "10")); fault = os.environ.get("FAULT", "none")
        if fault == "nan" and self.global_rank == 1 and self.global_step >= fs: loss = loss * float("nan")
        if fault == "hang" and self.global_rank == 1 and self.global_step == fs:
            import time
            print("rank 1 hanging", flush=True)
            while True: time.sleep(1)
        if fault == "oom" and self.global_rank == 1 and self.global_step == fs:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 12.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 2.10 GiB is free.")
        self.log("train_loss", loss, prog_bar=True); return loss
    def configure_optimizers(self): return torch.optim.SGD(self.parameters(), lr=0.01)
if __name__ == "__main__":
    x = torch.randn(512, 8); ds = TensorDataset(x, x.sum(1, keepdim=True))
    t = L.Trainer(strategy="ddp", accelerator="cpu", devices=2, max_epochs=int(os.environ.get('EPOCHS','1')), log_every_n_steps=1, logger=False, enable_checkpointing=False)
    t.fit(M(), DataLoader(ds, batch_size=8))
