# k49: sidecar `watch --match ... --log pod.log` on a torchrun pod, rank 1 hangs -> stall rank null, "suspect: pid N", alert "stall"
set -m
FAULT=hang FAULT_STEP=8 STEPS=300 torchrun --nproc-per-node 2 --master-port 29314 --tee 3 $S/t6.py > pod.log 2>&1 & job=$!
sleep 3; timeout --preserve-status -s INT 45 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps \
  --match 't6\.py' --log pod.log > out.txt 2>&1; kill -TERM $job; wait $job; sleep 2
python $S/show.py .
