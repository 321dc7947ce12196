#!/bin/bash
# dlate.sh NAME HP MPORT: a hand-started `torchrun --redirects 3 --log-dir tl` job first (rank 1 hangs at step 40, STEPS 300),
# the node daemon `watch --match 't7\.py'` started 8 s later; job killed (TERM to torchrun) and daemon SIGINT at 55 s
source /work/bb7/man.sh $1 $2
FAULT=hang FAULT_STEP=40 STEPS=300 python /work/bb7/dfl.py torchrun --nproc-per-node 2 --master-port $3 --redirects 3 --log-dir tl /work/bb7/t7.py > job.log 2>&1 & job=$!
sleep 8
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't7\.py' > out.txt 2> err.txt & ag=$!
sleep 47; kill -TERM $job; wait $job; rj=$?; sleep 6
kill -INT $ag; wait $ag; echo "job rc=$rj daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
