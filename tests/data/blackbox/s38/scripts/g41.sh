#!/bin/bash
source /work/bb5/man.sh g41 18941
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 'spawn5\.py' > out.txt 2> err.txt & ag=$!
sleep 3
FAULT=nan FAULT_STEP=15 STEPS=30 MASTER_PORT=29642 python /work/bb5/spawn5.py > job.log 2>&1; echo "job rc=$?" | tee rc.txt
sleep 6; kill -INT $ag; wait $ag; echo "daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee -a rc.txt
finish
