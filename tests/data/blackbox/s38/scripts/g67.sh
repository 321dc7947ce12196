#!/bin/bash
source /work/bb5/man.sh g67 18977
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 'hf5\.py' > out.txt 2> err.txt & ag=$!
sleep 3
FAULT=nan FAULT_STEP=20 STEPS=40 timeout 150 accelerate launch --multi_gpu --num_processes 2 --main_process_port 29677 /work/bb5/hf5.py > job.log 2>&1
echo "job rc=$?" | tee rc.txt
sleep 6; kill -INT $ag; wait $ag; echo "daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee -a rc.txt
finish
