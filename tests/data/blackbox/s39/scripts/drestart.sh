#!/bin/bash
# drestart.sh NAME HP MPORT: node daemon A on a hand-started healthy torchrun --redirects job; A gets SIGTERM at ~8 s, daemon B starts
# 2 s later and stays to the end
source /work/bb6/man.sh $1 $2
STEPS=60 torchrun --nproc-per-node 2 --master-port $3 --redirects 3 --log-dir tl /work/bb6/t6.py > job.log 2>&1 & job=$!
sleep 2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't6\.py' > outA.txt 2> errA.txt & A=$!
sleep 8; kill -TERM $A; wait $A; ra=$?; echo "daemon A rc=$ra at $(date -u +%T)"
sleep 2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't6\.py' > outB.txt 2> errB.txt & B=$!
wait $job; rj=$?
sleep 8; kill -INT $B; wait $B; echo "job rc=$rj daemon B rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
