# torch-free stand-in rank for a second user's healthy job (the venv's interpreter lives under /root, which user nobody
# cannot reach): prints t5.py's step lines at 0.2 s per step, identity from RANK/WORLD_SIZE/TORCHELASTIC_RUN_ID env.
import os, time, random
r = int(os.environ.get("RANK", "0")); random.seed(r)
for step in range(1, int(os.environ.get("STEPS", "35")) + 1):
    print(f"step={step} loss={5.0 / (1 + 0.05 * step) + random.random() * 0.1:.5f} lr=0.01 rank={r}", flush=True)
    time.sleep(0.2)
print(f"rank {r} done", flush=True)
