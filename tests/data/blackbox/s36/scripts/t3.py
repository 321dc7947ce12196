# tiny real DDP job over gloo, new fault kinds for batch s36. Env:
#  FAULT=nan|spin|fifo|exit0|segv|cpuoom|enospc|sysexit|spike|crash|ckpt_trunc|ckpt_small|slow|hang_dl|sigterm_self
#  FAULT_RANK FAULT_STEP STEPS STEP_DELAY  LOGFMT=plain|logging (python logging with asctime)  CKPT_DIR CKPT_EVERY
import os, sys, time, signal, logging
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
log = logging.getLogger("train")
def main():
    if os.environ.get("LOGFMT") == "logging":
        logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                            format="%(asctime)s - %(levelname)s - %(name)s - %(message)s")
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    m = DDP(torch.nn.Linear(8, 1)); opt = torch.optim.SGD(m.parameters(), lr=0.01)
    fault = os.environ.get("FAULT", "none")
    if os.environ.get("FAULT_ATTEMPTS") and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) >= int(os.environ["FAULT_ATTEMPTS"]):
        fault = "none"
    frank = int(os.environ.get("FAULT_RANK", "1")); fstep = int(os.environ.get("FAULT_STEP", "20"))
    steps = int(os.environ.get("STEPS", "40")); delay = float(os.environ.get("STEP_DELAY", "0.2"))
    ck = os.environ.get("CKPT_DIR"); every = int(os.environ.get("CKPT_EVERY", "5"))
    for step in range(1, steps + 1):
        x = torch.randn(16, 8); y = x.sum(1, keepdim=True)
        loss = ((m(x) - y) ** 2).mean()
        mine = r == frank and step >= fstep; at = r == frank and step == fstep
        if mine and fault == "nan": loss = loss * float("nan")
        if fault == "spike" and step == fstep: loss = loss * 1000.0
        if at and fault == "spin":
            print(f"rank {r} entering an endless compute loop", flush=True)
            a = torch.randn(64, 64)
            while True: a = torch.tanh(a @ a)
        if at and fault == "fifo":
            p = f"/tmp/bb3_fifo_{os.getpid()}"; os.mkfifo(p)
            print(f"rank {r} reading shard list from {p}", flush=True)
            open(p).read()
        if at and fault == "exit0":
            print(f"rank {r} finished its shard early, returning", flush=True); return
        if at and fault == "segv":
            import ctypes; ctypes.string_at(0)
        if at and fault == "cpuoom":
            big = torch.empty(1 << 46, dtype=torch.float32)
        if at and fault == "enospc":
            torch.save(m.state_dict(), "/dev/full")
        if at and fault == "sysexit":
            print("ERROR: tokenizer vocab mismatch (expected 50257, got 32000); aborting", file=sys.stderr, flush=True)
            sys.exit(3)
        if at and fault == "crash":
            raise RuntimeError(f"injected failure in rank {r} at step {step}")
        if at and fault == "sigterm_self": os.kill(os.getpid(), signal.SIGTERM)
        opt.zero_grad(); loss.backward(); opt.step()
        v = loss.item()
        if os.environ.get("LOGFMT") == "logging":
            log.info("step %d | loss %.5f | lr 0.01 | rank %d", step, v, r)
        else:
            print(f"step={step} loss={v:.5f} lr=0.01 rank={r}", flush=True)
        if ck and r == 0 and step % every == 0:
            os.makedirs(ck, exist_ok=True); f = os.path.join(ck, f"step{step:05d}.pt")
            sd = {"model": m.state_dict(), "pad": torch.zeros(20000)}
            if fault == "ckpt_small" and step >= fstep: sd = {"model": m.state_dict()}
            torch.save(sd, f)
            if fault == "ckpt_trunc" and step == fstep:
                n = os.path.getsize(f); os.truncate(f, n // 3)
                print(f"saved {f}", flush=True)
        d = delay * (5 if fault == "slow" and mine else 1)
        time.sleep(d)
    dist.barrier(); dist.destroy_process_group(); print(f"rank {r} done", flush=True)
if __name__ == "__main__": main()
