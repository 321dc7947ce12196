#!/bin/bash
# topc.sh NAME HP LPORT MPORT: `run --listen 127.0.0.1:LPORT -- torchrun --tee 3 --rdzv-id ...` where rank 1 is SIGSTOPped at step 10 for 45 s;
# at 30 s: `top --once http://127.0.0.1:LPORT` and /metrics (+ promtool check metrics); agent SIGINT at 40 s
source /work/bb7/man.sh $1 $2
FAULT=stopcont FAULT_STEP=10 SLOW_DELAY=45 STEPS=300 rankwatch run -c cfg.yaml --listen 127.0.0.1:$3 --findings-jsonl f.jsonl --dumps-dir dumps -- torchrun --nproc-per-node 2 --master-port $4 --tee 3 /work/bb7/t7.py > out.txt 2> err.txt & ag=$!
sleep 30
echo "=== top --once"; COLUMNS=160 NO_COLOR=1 timeout 20 rankwatch top --once http://127.0.0.1:$3 2>&1 | head -20
curl -s http://127.0.0.1:$3/metrics > metrics.txt; echo "=== metrics: $(wc -l < metrics.txt) lines"; grep -E '^rankwatch_(seconds_since_progress|step|process_state|active_findings)[{ ]' metrics.txt | head -12
echo "=== promtool"; promtool check metrics < metrics.txt 2>&1 | head -5; echo "promtool rc=${PIPESTATUS[0]}"
sleep 10; kill -INT $ag; wait $ag; echo "run rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
