#!/bin/bash
source /work/bb5/man.sh g06 18906
FAULT=exit0 FAULT_STEP=10 STEPS=40 timeout -s INT 60 torchrun --nproc-per-node 2 --master-port 29606 --no-python rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- python /work/bb5/t5.py > out.txt 2> err.txt
echo "rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
