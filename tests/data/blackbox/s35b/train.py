# tiny real DDP job over gloo (copied from /work/bb/train.py, extended). Fault injection via env:
#  FAULT=nan|nan_all|crash|oom|hang|slow|slow_all|diverge|subgroup_hang|swallow|none
#  FAULT_RANK=1 FAULT_STEP=20 STEPS=40 FMT=kv|json  FAULT_EVERY=1 (crash on every restart attempt)
import os, sys, time, signal, json
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def main():
    if os.environ.get("FAULT") == "hang_init" and os.environ.get("RANK") == os.environ.get("FAULT_RANK", "1"):
        print("rank stuck before init", flush=True)
        while True: time.sleep(1)
    dist.init_process_group("gloo")
    r, w = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    m = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    fault = os.environ.get("FAULT", "none")
    if os.environ.get("FAULT_ONCE") and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0": fault = "none"
    frank = int(os.environ.get("FAULT_RANK", "1"))
    fstep = int(os.environ.get("FAULT_STEP", "20")); steps = int(os.environ.get("STEPS", "40"))
    delay = float(os.environ.get("STEP_DELAY", "0.2")); fmt = os.environ.get("FMT", "kv")
    sub = dist.new_group([2, 3]) if fault == "subgroup_hang" else None
    it = range(1, steps + 1)
    if os.environ.get("TQDM") and r == 0:
        from tqdm import tqdm; it = tqdm(it, desc="train")
    for step in it:
        x = torch.randn(16, 8); y = x.sum(1, keepdim=True)
        loss = ((m(x) - y) ** 2).mean()
        mine = r == frank and step >= fstep
        if mine and fault == "nan": loss = loss * float("nan")
        if mine and fault == "inf" and step == fstep: loss = loss * float("inf")
        if fault == "nan_all" and step >= fstep: loss = loss * float("nan")
        if fault == "crash_all" and step == fstep: raise RuntimeError("injected failure in rank %d at step %d" % (r, step))
        if mine and step == fstep:
            if fault == "kill": os.kill(os.getpid(), signal.SIGKILL)
            if fault == "crash": raise RuntimeError("injected failure in rank %d at step %d" % (r, step))
            if fault == "hang":
                print(f"rank {r} about to hang", flush=True)
                while True: time.sleep(1)
            if fault == "logexc":
                import logging
                try:
                    raise OSError(f"transient read error on shard 17 (rank {r}, step {step})")
                except OSError:
                    logging.exception("data loading failed, retrying with the next shard")
            if fault == "swallow":
                try:
                    raise ValueError(f"bad batch on rank {r} at step {step}")
                except ValueError as e:
                    print(f"rank {r}: skipping the rest after error: {e}", flush=True)
                    dist.barrier()  # the others are still in DDP all_reduce: deadlock
                    return
        if sub is not None and step == fstep and r in (2, 3):
            if r == frank:
                print(f"rank {r} stuck before sub-group all_reduce", flush=True)
                while True: time.sleep(1)
            dist.all_reduce(torch.ones(1), group=sub)
        opt.zero_grad(); loss.backward(); opt.step()
        shown = loss.item()
        if fault == "diverge" and step >= fstep: shown = shown + 0.5 * 1.25 ** (step - fstep)
        if os.environ.get("RANK0_ONLY") and r != 0: pass
        elif fmt == "json": print(json.dumps({"step": step, "loss": round(shown, 5), "lr": 0.01}), flush=True)
        else: print(f"step={step} loss={shown:.5f} lr=0.01 rank={r}", flush=True)
        d = delay
        if fault == "slow" and mine: d *= 5
        if fault == "slow_all" and step >= fstep: d *= 5
        time.sleep(d)
    dist.barrier(); dist.destroy_process_group()
    print(f"rank {r} done", flush=True)
if __name__ == "__main__": main()
