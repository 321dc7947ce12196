# DDP with a DataLoader (1 worker); on rank 1 the worker blocks forever at sample HANG_AT
import os, time, torch, torch.distributed as dist
from torch.utils.data import Dataset, DataLoader
from torch.nn.parallel import DistributedDataParallel as DDP
class DS(Dataset):
    def __init__(self, r): self.r = r
    def __len__(self): return 4000
    def __getitem__(self, i):
        if self.r == 1 and i == int(os.environ.get("HANG_AT", "96")):
            os.kill(os.getpid(), 9)
        x = torch.randn(8); return x, x.sum(0, keepdim=True)
def main():
    dist.init_process_group("gloo"); r = dist.get_rank()
    m = DDP(torch.nn.Linear(8, 1)); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    dl = DataLoader(DS(r), batch_size=8, num_workers=1)
    for step, (x, y) in enumerate(dl, 1):
        loss = torch.nn.functional.mse_loss(m(x), y); opt.zero_grad(); loss.backward(); opt.step()
        print(f"step={step} loss={loss.item():.5f} rank={r}", flush=True); time.sleep(0.2)
        if step == 60: break
    dist.destroy_process_group()
if __name__ == "__main__": main()
