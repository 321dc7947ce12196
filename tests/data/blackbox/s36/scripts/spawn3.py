# torch.multiprocessing.spawn launcher, workers set RANK themselves, then run t3.py's main
import os, torch.multiprocessing as mp
def worker(r, w):
    os.environ.update(RANK=str(r), WORLD_SIZE=str(w), LOCAL_RANK=str(r))
    import t3; t3.main()
if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29678")
    mp.spawn(worker, args=(2,), nprocs=2)
