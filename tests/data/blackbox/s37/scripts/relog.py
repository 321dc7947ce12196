# one process writing step lines to $1 (opened in append mode, line-buffered); at step DEL_STEP it deletes the file
# and recreates it (rm + new open, no rename); NaN loss from NAN_STEP. STEP_DELAY per step.
import os, sys, time
p = sys.argv[1]; ds = int(os.environ.get("DEL_STEP", "10")); ns = int(os.environ.get("NAN_STEP", "20"))
f = open(p, "a", buffering=1)
for s in range(1, int(os.environ.get("STEPS", "40")) + 1):
    if s == ds: f.close(); os.unlink(p); f = open(p, "a", buffering=1)
    loss = float("nan") if s >= ns else 1.0 / s
    f.write(f"step={s} loss={loss:.5f} lr=0.01\n"); time.sleep(float(os.environ.get("STEP_DELAY", "0.5")))
