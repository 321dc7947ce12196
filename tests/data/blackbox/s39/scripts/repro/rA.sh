# k10/k12/k15: two torchrun "nodes" (one agent each, one dumps dir), NaN on global rank 3 -> two alerts, node 1's run "default"
for n in 0 1; do FAULT=nan FAULT_RANK=3 FAULT_STEP=12 STEPS=30 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl \
  --dumps-dir dumps --set runner.log_dir=$W/logs$n -- torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \
  --rdzv-endpoint 127.0.0.1:29311 --rdzv-id rA --tee 3 $S/t6.py > out-$n.txt 2>&1 & eval a$n=\$!; done; wait $a0 $a1; sleep 3
python $S/show.py .
