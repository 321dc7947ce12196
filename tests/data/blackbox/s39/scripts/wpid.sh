#!/bin/bash
# wpid.sh NAME HP MPORT: `accelerate launch ... acc6.py > job.log 2>&1 &` started by hand, then `watch --pid <launcher pid>`
# (the README's sidecar on a launcher whose stdout/stderr go to one file); rank 1 hangs at step 10, rank 0 waits in gather
source /work/bb6/man.sh $1 $2
FAULT=hang_gather FAULT_STEP=10 STEPS=300 accelerate launch --multi_gpu --num_processes 2 --main_process_port $3 /work/bb6/acc6.py > job.log 2>&1 & job=$!
sleep 4
timeout --preserve-status -s INT 55 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --pid $job > out.txt 2> err.txt; rw=$?
kill -TERM -- -$job; wait $job; echo "watch rc=$rw job rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
