#!/bin/bash
source /work/bb5/man.sh g57 18967
FAULT=hang_barrier FAULT_STEP=8 STEPS=300 timeout -s INT 50 torchrun --nproc-per-node 2 --master-port 29667 --no-python rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- python /work/bb5/t5.py > out.txt 2> err.txt
echo "rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
