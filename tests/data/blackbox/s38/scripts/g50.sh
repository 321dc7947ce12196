#!/bin/bash
source /work/bb5/man.sh g50 18960
FAULT=hang_barrier FAULT_STEP=8 STEPS=300 MASTER_PORT=29660 python /work/bb5/spawn5.py > job.log 2>&1 & sp=$!
sleep 4
timeout --preserve-status -s INT 50 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --pid $sp > out.txt 2> err.txt
echo "watch rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
echo "job alive after the agent: $(kill -0 $sp 2>&1 && echo yes)" | tee -a rc.txt
kill -9 $(pgrep -P $sp) $sp 2>/dev/null; wait $sp
finish
