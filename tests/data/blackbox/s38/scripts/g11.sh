#!/bin/bash
source /work/bb5/man.sh g11 18911
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't5\.py' > out.txt 2> err.txt & ag=$!
sleep 3
FAULT=crash ONLY_ATTEMPT=0 FAULT_STEP=10 STEPS=25 timeout -s INT 120 torchrun --nproc-per-node 2 --master-port 29611 --max-restarts 1 --redirects 3 --log-dir tl /work/bb5/t5.py > job.log 2>&1
echo "job rc=$?" | tee rc.txt
sleep 8; kill -INT $ag; wait $ag; echo "daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee -a rc.txt
finish
