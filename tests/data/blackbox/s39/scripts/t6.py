# tiny real DDP job over gloo, fault placements for batch s39. Env:
#  FAULT=none|nan|crash|hang|osexit1|abort|sysexit3|segv|oom_bwd|oom_all|evalnan|plateau|slow_dl|slow_start|lscale|lscale_ok|sigint_self
#  ONLY_ATTEMPT=n: the fault only in torchrun attempt n (TORCHELASTIC_RESTART_COUNT)
#  FAULT_RANK FAULT_STEP STEPS STEP_DELAY SLOW_DELAY EVAL_EVERY PG_TIMEOUT (s, gloo timeout) NUM_WORKERS
#  LOGFMT=print|json (json lines through logging on stdout)|rotate (RotatingFileHandler to LOGFILE, MAXBYTES) ; TAG (ignored: for --match)
import os, sys, time, json, logging, datetime
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
F = os.environ.get("FAULT", "none")
if os.environ.get("ONLY_ATTEMPT") and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != os.environ["ONLY_ATTEMPT"]: F = "none"
if os.environ.get("FAULT_ARRAY_TASK") and os.environ.get("SLURM_ARRAY_TASK_ID") != os.environ["FAULT_ARRAY_TASK"]: F = "none"
FR = int(os.environ.get("FAULT_RANK", "1")); FS = int(os.environ.get("FAULT_STEP", "20"))
SD = float(os.environ.get("SLOW_DELAY", "1.0"))
class DS(torch.utils.data.Dataset):
    def __init__(self, r): self.r = r; self.n = 0
    def __len__(self): return 100000
    def __getitem__(self, i):
        if F == "slow_dl" and i >= FS * 16: time.sleep(SD / 16)
        if F == "slow_start" and i < 3 * 16: time.sleep(SD / 16)
        g = torch.Generator().manual_seed(i); x = torch.randn(8, generator=g); return x, x.sum(0, keepdim=True)
def setup_log(r):
    fmt = os.environ.get("LOGFMT", "print")
    lg = logging.getLogger("train"); lg.setLevel(logging.INFO); lg.propagate = False
    if fmt == "json":
        h = logging.StreamHandler(sys.stdout); h.setFormatter(logging.Formatter("%(message)s")); lg.addHandler(h)
        return lambda step, loss, **kw: lg.info(json.dumps({"step": step, "loss": loss, "lr": 0.01, "rank": r, **kw}))
    if fmt == "rotate":
        from logging.handlers import RotatingFileHandler
        h = RotatingFileHandler(os.environ["LOGFILE"], maxBytes=int(os.environ.get("MAXBYTES", "1500")), backupCount=5)
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s step=%(step)s loss=%(loss).5f lr=0.01 rank=%(rank)s"))
        lg.addHandler(h)
        return lambda step, loss, **kw: lg.info("", extra={"step": step, "loss": loss, "rank": r})
    return lambda step, loss, **kw: print(f"step={step} loss={loss:.5f} lr=0.01 rank={r}", flush=True)
def init():
    to = datetime.timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "1800")))
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torch 2.13 gloo re-reads the previous attempt's addresses from the agent's store on a restart: own key prefix
        st = dist.PrefixStore("attempt" + os.environ["TORCHELASTIC_RESTART_COUNT"],
                              dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False))
        dist.init_process_group("gloo", store=st, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]), timeout=to)
    else:
        dist.init_process_group("gloo", timeout=to)
def main():
    init()
    r, w = dist.get_rank(), dist.get_world_size()
    log = setup_log(r)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    m = DDP(net); lr = 0.0 if F == "plateau" else 0.01
    opt = torch.optim.SGD(m.parameters(), lr=lr)
    steps = int(os.environ.get("STEPS", "40")); delay = float(os.environ.get("STEP_DELAY", "0.2"))
    ev = int(os.environ.get("EVAL_EVERY", "0"))
    dl = torch.utils.data.DataLoader(DS(r), batch_size=16, num_workers=int(os.environ.get("NUM_WORKERS", "0")))
    it = iter(dl); fixed = next(iter(dl)); scale = 65536.0
    for step in range(1, steps + 1):
        x, y = fixed if F == "plateau" else next(it)
        if r == FR and step == FS:
            if F == "osexit1": os._exit(1)
            if F == "abort": os.abort()
            if F == "sysexit3": sys.exit(3)
            if F == "segv": import signal; os.kill(os.getpid(), signal.SIGSEGV); time.sleep(5)
            if F == "sigint_self": import signal; os.kill(os.getpid(), signal.SIGINT); time.sleep(5)
            if F == "hang":
                print(f"rank {r} waiting for the next shard", flush=True)
                while True: time.sleep(1)
        loss = ((m(x) - y) ** 2).mean()
        if F == "nan" and r == FR and step >= FS: loss = loss * float("nan")
        if F == "crash" and r == FR and step == FS: raise RuntimeError(f"injected failure in rank {r} at step {step}")
        hooks = []
        if (F == "oom_bwd" and r == FR and step == FS) or (F == "oom_all" and step == FS):
            def boom(g):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79.10 GiB of which 712.00 MiB is free. Of the allocated memory 76.02 GiB is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated.")
            hooks.append(net[0].weight.register_hook(boom))
        shown = loss.item()
        opt.zero_grad(); loss.backward(); opt.step()
        for h in hooks: h.remove()
        if F in ("lscale", "lscale_ok"):
            if (F == "lscale" and step >= FS) or (F == "lscale_ok" and step in (2, 3, 4)):
                new = max(scale / 2, 1.0)
                print(f"[deepspeed] OVERFLOW! Rank {r} Skipping step. Attempted loss scale: {int(scale)}, reducing to {int(new)}", flush=True)
                scale = new
        log(step, shown)
        if ev and step % ev == 0:
            with torch.no_grad():
                el = ((m.module(x) - y) ** 2).mean().item()
            if F == "evalnan" and step >= FS: el = float("nan")
            print(f"eval step={step} eval_loss={el:.5f} rank={r}", flush=True)
        time.sleep(delay)
    dist.barrier(); dist.destroy_process_group(); print(f"rank {r} done", flush=True)
if __name__ == "__main__": main()
