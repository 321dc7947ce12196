#!/bin/bash
source /work/bb5/man.sh g39 18939
FAULT=nan FAULT_STEP=8 STEPS=300 timeout -s INT 35 rankwatch run -c cfg.yaml --listen 127.0.0.1:19439 --findings-jsonl f.jsonl --dumps-dir dumps -- torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29639 --rdzv-id job39 --tee 3 /work/bb5/t5.py > out.txt 2> err.txt & ag=$!
sleep 25
rankwatch top http://127.0.0.1:19439 --once > top.txt 2>&1; echo "top rc=$?" >> top.txt
curl -s http://127.0.0.1:19439/metrics | grep -E '^rankwatch_step\{' > metrics.txt
wait $ag; echo "rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
cat top.txt metrics.txt
finish
