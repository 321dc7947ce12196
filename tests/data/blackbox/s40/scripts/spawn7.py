# torch.multiprocessing.spawn with join=False and NPROCS workers (each sets RANK/WORLD_SIZE itself), runs t7.main
import os, sys, torch.multiprocessing as mp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
def worker(r, w):
    os.environ.update(RANK=str(r), WORLD_SIZE=str(w), LOCAL_RANK=str(r))
    import t7; t7.main()
if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29978")
    n = int(os.environ.get("NPROCS", "3"))
    ctx = mp.spawn(worker, args=(n,), nprocs=n, join=False)
    while not ctx.join(timeout=1): pass
    print("all workers finished", flush=True)
