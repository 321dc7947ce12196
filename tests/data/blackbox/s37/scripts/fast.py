# no torch: a job that ends cleanly in well under 2 s
import os
for s in range(1, 6): print(f"step={s} loss={1.0/s:.4f} lr=0.01", flush=True)
print("done")
