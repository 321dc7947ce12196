# torch.multiprocessing.spawn launcher; each worker sets RANK/WORLD_SIZE itself and runs t5.main (same FAULT env)
import os, sys, torch.multiprocessing as mp
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
def worker(r, w):
    os.environ.update(RANK=str(r), WORLD_SIZE=str(w), LOCAL_RANK=str(r))
    import t5; t5.main()
if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29678")
    mp.spawn(worker, args=(2,), nprocs=2)
