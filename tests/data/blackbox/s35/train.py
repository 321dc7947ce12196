# tiny real DDP job over gloo. Fault injection via env:
#  FAULT=nan|crash|oom|exit0|hang|kill|slow|none  FAULT_RANK=1 FAULT_STEP=20 STEPS=40
import os, sys, time, signal
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def main():
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    m = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    fault = os.environ.get("FAULT", "none")
    if os.environ.get("FAULT_ONCE") and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0": fault = os.environ.get("FAULT2", "none")
    frank = int(os.environ.get("FAULT_RANK", "1"))
    fstep = int(os.environ.get("FAULT_STEP", "20")); steps = int(os.environ.get("STEPS", "40"))
    delay = float(os.environ.get("STEP_DELAY", "0.2"))
    for step in range(1, steps + 1):
        x = torch.randn(16, 8); y = x.sum(1, keepdim=True)
        loss = ((m(x) - y) ** 2).mean()
        mine = r == frank and step >= fstep
        if mine and fault == "nan": loss = loss * float("nan")
        if mine and step == fstep:
            if fault == "crash": raise RuntimeError(os.environ.get("CRASH_MSG", "") + "injected failure in rank %d at step %d" % (r, step))
            if fault == "oom": raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.15 GiB total capacity; 3.20 GiB already allocated; 1.50 GiB free)")
            if fault == "exit0": print(f"rank {r} leaving early", flush=True); return
            if fault == "kill": os.kill(os.getpid(), signal.SIGKILL)
            if fault == "hang":
                print(f"rank {r} about to hang", flush=True)
                while True: time.sleep(1)
        opt.zero_grad(); loss.backward(); opt.step()
        print(f"step={step} loss={loss.item():.5f} lr=0.01 rank={r}", flush=True)
        d = delay * (5 if fault == "slow" and mine else 1)
        time.sleep(d)
    dist.barrier(); dist.destroy_process_group()
    print(f"rank {r} done", flush=True)
if __name__ == "__main__": main()
