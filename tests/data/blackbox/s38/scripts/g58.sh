#!/bin/bash
source /work/bb5/man.sh g58 18968
for j in 1 2; do
  FAULT=crash FAULT_STEP=5 STEPS=20 timeout -s INT 60 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:2966$j --rdzv-id job58 --tee 3 /work/bb5/t5.py > out-$j.txt 2> err-$j.txt
  echo "job $j rc=$? at=$(date -u +%T)" | tee -a rc.txt
  sleep 3
done
finish
