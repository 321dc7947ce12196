# A (g47): one agent per rank, rank 1 raises at step 10 -> two alerts
for r in 0 1; do RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29901 FAULT=crash FAULT_STEP=10 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- python $S/t5.py > out-$r.txt 2>&1 & done; wait; sleep 2; python $S/show.py . | grep -A9 -- '--- hook'
