# k18: rank 1 hangs in attempt 0, gloo's 25 s timeout ends rank 0, torchrun restarts -> "crash on rank 0", suspect null
FAULT=hang ONLY_ATTEMPT=0 FAULT_STEP=8 PG_TIMEOUT=25 STEPS=15 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl \
  --dumps-dir dumps -- torchrun --nproc-per-node 2 --master-port 29312 --max-restarts 1 --tee 3 $S/t6.py > out.txt 2>&1; sleep 3
python $S/show.py .
