# tiny real DDP job over gloo, fault PLACEMENTS for batch s37. Env:
#  FAULT=crash_bwd|kill_opt|hang_dlw|crash_opt|crash_eval|crash_save|crash_dlw|crash|nan|hang_eval|hang_bwd
#  FAULT_RANK FAULT_STEP STEPS STEP_DELAY EVAL_EVERY CKPT_DIR CKPT_EVERY NUM_WORKERS
#  LOGFMT=plain|custom (logging, custom Formatter)|buffered (print, no flush)|jsonfile (JSON lines to metrics-rank{r}.jsonl)
#  SILENT_START=seconds (print nothing before training)
import os, sys, time, json, logging
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
F = os.environ.get("FAULT", "none"); FR = int(os.environ.get("FAULT_RANK", "1")); FS = int(os.environ.get("FAULT_STEP", "20"))
class DS(torch.utils.data.Dataset):
    def __init__(self, r): self.r = r
    def __len__(self): return 100000
    def __getitem__(self, i):
        if F == "crash_dlw" and self.r == FR and i >= FS * 16:
            raise IOError(f"corrupt record {i} in shard-00{self.r}.tar: unexpected EOF")
        if F == "hang_dlw" and self.r == FR and i >= FS * 16:
            while True: time.sleep(1)
        g = torch.Generator().manual_seed(i); x = torch.randn(8, generator=g); return x, x.sum(0, keepdim=True)
class Fmt(logging.Formatter):
    def format(self, rec): return f"<{rec.levelname[0]}> {time.strftime('%H:%M:%S')} [r{os.environ.get('RANK','?')}] {rec.getMessage()}"
def main():
    fmt = os.environ.get("LOGFMT", "plain")
    log = logging.getLogger("trainer")
    if fmt == "custom":
        h = logging.StreamHandler(sys.stdout); h.setFormatter(Fmt()); log.addHandler(h); log.setLevel(logging.INFO)
    silent = float(os.environ.get("SILENT_START", "0"))
    if silent: time.sleep(silent)
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    m = DDP(torch.nn.Linear(8, 1)); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    steps = int(os.environ.get("STEPS", "40")); delay = float(os.environ.get("STEP_DELAY", "0.2"))
    ev = int(os.environ.get("EVAL_EVERY", "0")); ck = os.environ.get("CKPT_DIR"); every = int(os.environ.get("CKPT_EVERY", "5"))
    jf = open(f"metrics-rank{r}.jsonl", "a") if fmt == "jsonfile" else None
    dl = torch.utils.data.DataLoader(DS(r), batch_size=16, num_workers=int(os.environ.get("NUM_WORKERS", "0")))
    it = iter(dl); state = {"step": 0}
    if F == "crash_bwd":
        def hook(g):
            if r == FR and state["step"] == FS: raise RuntimeError(f"injected failure in backward hook on rank {r}")
            return g
        m.module.weight.register_hook(hook)
    if F == "crash_opt":
        def pre(o, a, k):
            if r == FR and state["step"] == FS: raise RuntimeError(f"optimizer state corrupted: exp_avg shape mismatch on rank {r}")
        opt.register_step_pre_hook(pre)
    if F == "kill_opt":
        import signal
        def pre2(o, a, k):
            if r == FR and state["step"] == FS: os.kill(os.getpid(), signal.SIGKILL)
        opt.register_step_pre_hook(pre2)
    def out(step, v):
        if fmt == "custom": log.info("it %d :: loss=%.5f lr=0.01", step, v)
        elif fmt == "buffered": print(f"step={step} loss={v:.5f} lr=0.01 rank={r}")
        elif fmt == "jsonfile": jf.write(json.dumps({"step": step, "loss": v, "lr": 0.01, "rank": r}) + "\n"); jf.flush()
        else: print(f"step={step} loss={v:.5f} lr=0.01 rank={r}", flush=True)
    for step in range(1, steps + 1):
        state["step"] = step
        x, y = next(it)
        loss = ((m(x) - y) ** 2).mean()
        if F == "nan" and r == FR and step >= FS: loss = loss * float("nan")
        if F == "crash" and r == FR and step == FS: raise RuntimeError(f"injected failure in rank {r} at step {step}")
        if F == "hang_bwd" and r == FR and step == FS:
            def hb(g):
                print(f"rank {r} waiting in backward hook", flush=True)
                while True: time.sleep(1)
            m.module.weight.register_hook(hb)
        opt.zero_grad(); loss.backward(); opt.step()
        out(step, loss.item())
        if ev and step % ev == 0:
            with torch.no_grad():
                if F == "crash_eval" and r == FR and step == FS:
                    raise ValueError(f"eval: predictions shape (16, 2) != labels shape (16, 1) on rank {r}")
                if F == "hang_eval" and r == FR and step == FS:
                    print(f"rank {r} evaluating", flush=True)
                    while True: time.sleep(1)
                vl = ((m(x) - y) ** 2).mean(); t = vl.clone(); dist.all_reduce(t)
                if fmt != "jsonfile": print(f"eval step={step} val_loss={t.item()/w:.5f} rank={r}", flush=True)
        if ck and r == 0 and step % every == 0:
            os.makedirs(ck, exist_ok=True)
            sd = {"model": m.state_dict(), "step": step}
            if F == "crash_save" and step == FS:
                class Bad:
                    def __reduce__(self): raise OSError(28, "No space left on device")
                sd["extra"] = Bad()
            torch.save(sd, os.path.join(ck, f"step{step:05d}.pt"))
        time.sleep(delay)
    dist.barrier(); dist.destroy_process_group(); print(f"rank {r} done", flush=True)
if __name__ == "__main__": main()
