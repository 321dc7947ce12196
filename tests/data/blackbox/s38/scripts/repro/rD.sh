# D (g21): mp.spawn worker 1 SIGKILLed at step 10 -> crash rank null, "No error was recognised"
MASTER_PORT=29903 FAULT=extkill FAULT_STEP=10 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl -- python $S/spawn5.py > out.txt 2>&1; sleep 2; python $S/show.py .
