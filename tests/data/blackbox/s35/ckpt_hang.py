# DDP; at step SAVE_STEP rank 0 saves a checkpoint into CKPT_DIR and its write blocks forever mid-save
import os, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
class SlowFile:
    def __init__(self, f): self.f = f; self.n = 0
    def write(self, b):
        self.n += 1
        if self.n > 2:
            while True: time.sleep(1)
        return self.f.write(b)
    def flush(self): self.f.flush()
def main():
    dist.init_process_group("gloo"); r = dist.get_rank()
    m = DDP(torch.nn.Linear(64, 64)); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    d = os.environ["CKPT_DIR"]
    for step in range(1, 200):
        x = torch.randn(16, 64); loss = (m(x) - x).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
        print(f"step={step} loss={loss.item():.5f}", flush=True); time.sleep(0.2)
        if step % 10 == 0 and r == 0:
            p = os.path.join(d, f"step-{step}.pt")
            with open(p, "wb") as f:
                torch.save(m.state_dict(), SlowFile(f) if step == 20 else f)
        dist.barrier()
if __name__ == "__main__": main()
