# tiny real DDP job over gloo, fault placements for batch s40 (from s39's t6.py). Env:
#  FAULT=none|nan|crash|hang|stopcont|sockhang|straggle|infdiv|gninf|gninf_first
#  FAULT_RANK FAULT_STEP STEPS STEP_DELAY SLOW_DELAY (straggle: extra s/step; stopcont: seconds stopped)
#  NOISE=ansi (ANSI-coloured step lines + a real tqdm bar on stderr) | bytes (invalid UTF-8 + a 5 MB line at step 8 on FAULT_RANK)
#        | warn (a real torch LR-scheduler warning + numpy RuntimeWarnings every step, warnings "always")
#  CKPT_EVERY (rank 0 torch.save to ck/stepNNNNN.pt), CKPT_ZERO (that step's save cut to 0 bytes), CKPT_KEEP (keep only the last N)
#  MSG (crash message text override)
import os, sys, time, datetime, warnings
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
F = os.environ.get("FAULT", "none"); NOISE = os.environ.get("NOISE", "")
FR = int(os.environ.get("FAULT_RANK", "1")); FS = int(os.environ.get("FAULT_STEP", "20"))
SD = float(os.environ.get("SLOW_DELAY", "1.0"))
CE = int(os.environ.get("CKPT_EVERY", "0")); CZ = int(os.environ.get("CKPT_ZERO", "0")); CK = int(os.environ.get("CKPT_KEEP", "0"))
class DS(torch.utils.data.Dataset):
    def __len__(self): return 100000
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i); x = torch.randn(8, generator=g); return x, x.sum(0, keepdim=True)
def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("PG_TIMEOUT", "1800"))))
    r, w = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    m = DDP(net); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1000)
    steps = int(os.environ.get("STEPS", "40")); delay = float(os.environ.get("STEP_DELAY", "0.2"))
    it = iter(torch.utils.data.DataLoader(DS(), batch_size=16))
    bar = None
    if NOISE == "ansi":
        from tqdm import tqdm
        bar = tqdm(total=steps, file=sys.stderr, mininterval=0, dynamic_ncols=False, ncols=90, desc=f"rank{r}", colour="green")
    if NOISE == "warn": warnings.simplefilter("always")
    saved = []
    for step in range(1, steps + 1):
        x, y = next(it)
        if r == FR and step == FS:
            if F == "hang":
                print(f"rank {r} waiting for the next shard", flush=True)
                while True: time.sleep(1)
            if F == "stopcont":
                import subprocess
                subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -STOP {os.getpid()}; sleep {SD}; kill -CONT {os.getpid()}"])
            if F == "sockhang":
                import socket
                srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
                c = socket.create_connection(srv.getsockname())
                print(f"rank {r} fetching shard {step} from the data service", flush=True)
                c.recv(1)  # the service never answers
        if NOISE == "bytes" and r == FR and step == 8:
            sys.stdout.flush()
            sys.stdout.buffer.write(b"tokenizer warning: skipped bytes \xff\xfe\xc3\x28\xa0\xa1 in sample 8\n")
            sys.stdout.buffer.write(b"batch ids: " + b" ".join(str(i).encode() for i in range(800000)) + b"\n")
            sys.stdout.buffer.flush()
        if F == "straggle" and r == FR and step >= FS: time.sleep(SD)
        loss = ((m(x) - y) ** 2).mean()
        if F == "nan" and r == FR and step >= FS: loss = loss * float("nan")
        if F == "crash" and r == FR and step == FS: raise RuntimeError(os.environ.get("MSG", f"injected failure in rank {r} at step {step}"))
        shown = loss.item()
        if F == "infdiv" and r == FR and step >= FS: shown = float(torch.tensor(shown, dtype=torch.float32) * torch.tensor(1e6, dtype=torch.float32) ** (step - FS + 1))
        opt.zero_grad(); loss.backward()
        gn = float(torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9))
        if (F == "gninf" and r == FR and step >= FS) or (F == "gninf_first" and step == 1): gn = float("inf")
        opt.step()
        if NOISE == "warn":
            sched.step(step)  # real torch: "The epoch parameter in `scheduler.step()` was not necessary ..."
            import numpy as np
            np.mean(np.array([]))  # real numpy: "Mean of empty slice" / "invalid value encountered"
        line = f"step={step} loss={shown:.5f} grad_norm={gn:.4f} lr=0.01 rank={r}"
        if NOISE == "ansi":
            bar.write(f"\x1b[1;32m[train]\x1b[0m \x1b[36mstep={step}\x1b[0m loss=\x1b[33m{shown:.5f}\x1b[0m lr=0.01 rank={r}", file=sys.stdout); sys.stdout.flush()
            bar.update(1); bar.set_postfix(loss=f"{shown:.4f}")
        else:
            print(line, flush=True)
        if CE and r == 0 and step % CE == 0:
            os.makedirs("ck", exist_ok=True); p = f"ck/step{step:05d}.pt"
            torch.save({"model": m.module.state_dict(), "opt": opt.state_dict(), "step": step}, p)
            if step == CZ: os.truncate(p, 0)
            saved.append(p)
            if CK and len(saved) > CK: os.remove(saved.pop(0))
        time.sleep(delay)
    if bar: bar.close()
    dist.barrier(); dist.destroy_process_group(); print(f"rank {r} done", flush=True)
if __name__ == "__main__": main()
