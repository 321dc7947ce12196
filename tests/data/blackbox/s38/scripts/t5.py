# tiny real DDP job over gloo, fault placements for batch s38. Env:
#  FAULT=none|hang_barrier|hang_bcast|spin_gather|mismatch|nan_first|nan_batch|blip|exit0|selfstop|extkill|slow|unused|memerr_dlw|crash|nan
#  ONLY_ATTEMPT=n: the fault only in torchrun attempt n (TORCHELASTIC_RESTART_COUNT)
#  FAULT_RANK FAULT_STEP STEPS STEP_DELAY SLOW_DELAY CKPT_DIR CKPT_EVERY CKPT_KIND=pt|dcp NUM_WORKERS TAG (ignored: for --match)
import os, sys, time, json
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
F = os.environ.get("FAULT", "none")
if os.environ.get("ONLY_ATTEMPT") and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != os.environ["ONLY_ATTEMPT"]: F = "none"
if os.environ.get("FAULT_A1") and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "1": F = os.environ["FAULT_A1"]  # attempt 1's own fault
FR = int(os.environ.get("FAULT_RANK", "1")); FS = int(os.environ.get("FAULT_STEP", "20"))
class DS(torch.utils.data.Dataset):
    def __init__(self, r): self.r = r
    def __len__(self): return 100000
    def __getitem__(self, i):
        if F == "segv_dlw" and self.r == FR and i >= FS * 16:
            import signal; os.kill(os.getpid(), signal.SIGSEGV)
        if F == "memerr_dlw" and self.r == FR and i >= FS * 16:
            raise MemoryError(f"cannot allocate decode buffer for sample {i}")
        g = torch.Generator().manual_seed(i); x = torch.randn(8, generator=g); return x, x.sum(0, keepdim=True)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.a = torch.nn.Linear(8, 1); self.b = torch.nn.Linear(8, 1)
    def forward(self, x, use_b=True):
        return self.a(x) + (self.b(x) if use_b else 0)
def main():
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torch 2.13 gloo re-reads the previous attempt's addresses from the agent's store on a restart (connectFullMesh
        # refused, also without rankwatch): give each attempt its own key prefix
        st = dist.PrefixStore("attempt" + os.environ["TORCHELASTIC_RESTART_COUNT"],
                              dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False))
        dist.init_process_group("gloo", store=st, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    m = DDP(Net()); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    steps = int(os.environ.get("STEPS", "40")); delay = float(os.environ.get("STEP_DELAY", "0.2"))
    ck = os.environ.get("CKPT_DIR"); every = int(os.environ.get("CKPT_EVERY", "5")); kind = os.environ.get("CKPT_KIND", "pt")
    dl = torch.utils.data.DataLoader(DS(r), batch_size=16, num_workers=int(os.environ.get("NUM_WORKERS", "0")))
    it = iter(dl)
    for step in range(1, steps + 1):
        x, y = next(it)
        if F == "nan_batch" and r == FR and step == FS: x = x.clone(); x[3, 2] = float("nan")
        if F == "exit0" and r == FR and step == FS:
            print(f"rank {r}: early stopping criterion met, leaving", flush=True); return
        if F == "selfstop" and r == FR and step == FS:
            import signal; os.kill(os.getpid(), signal.SIGSTOP)
        if F == "extkill" and r == FR and step == FS:
            os.system(f"kill -9 {os.getpid()}"); time.sleep(5)
        loss = ((m(x, use_b=not (F == "unused" and step == FS)) - y) ** 2).mean()
        if F == "nan" and r == FR and step >= FS: loss = loss * float("nan")
        if F == "nan_first" and r == FR: loss = loss * float("nan")
        if F == "crash" and r == FR and step == FS: raise RuntimeError(f"injected failure in rank {r} at step {step}")
        shown = loss.item() * (8.0 if F == "blip" and step == FS else 1.0)
        opt.zero_grad(); loss.backward(); opt.step()
        print(f"step={step} loss={shown:.5f} lr=0.01 rank={r}", flush=True)
        if step == FS and F in ("hang_barrier", "hang_bcast", "spin_gather", "mismatch"):
            t = torch.ones(4) * r
            if F == "hang_barrier":
                if r == FR:
                    print(f"rank {r} waiting for shard download", flush=True)
                    while True: time.sleep(1)
                dist.barrier()
            elif F == "hang_bcast":
                if r == FR:
                    print(f"rank {r} reading vocabulary", flush=True)
                    while True: time.sleep(1)
                dist.broadcast(t, src=FR)
            elif F == "spin_gather":
                if r == FR:
                    a = torch.randn(64, 64)
                    while True: a = torch.tanh(a @ a)
                out = [torch.zeros(4) for _ in range(w)]; dist.all_gather(out, t)
            elif F == "mismatch":
                if r == FR:
                    out = [torch.zeros(4) for _ in range(w)]; dist.all_gather(out, t)
                else:
                    dist.all_reduce(t)
        if F == "slow" and r == FR and step >= FS:  # compute-bound straggler: spins SLOW_DELAY s per step
            t0 = time.time(); a = torch.randn(64, 64)
            while time.time() - t0 < float(os.environ.get("SLOW_DELAY", "1.0")): a = torch.tanh(a @ a)
        if ck and step % every == 0:
            if kind == "dcp":
                import torch.distributed.checkpoint as dcp
                dcp.save({"model": m.module.state_dict()}, checkpoint_id=os.path.join(ck, f"step{step:05d}"))
            elif r == 0:
                os.makedirs(ck, exist_ok=True); torch.save({"model": m.state_dict(), "step": step}, os.path.join(ck, f"step{step:05d}.pt"))
        time.sleep(delay)
    if F == "hang_end" and r == FR:
        print(f"rank {r} uploading final artifacts", flush=True)
        while True: time.sleep(1)
    dist.barrier(); dist.destroy_process_group(); print(f"rank {r} done", flush=True)
if __name__ == "__main__": main()
