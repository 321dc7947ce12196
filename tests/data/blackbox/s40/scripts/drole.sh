#!/bin/bash
# drole.sh NAME HP MPORT: node daemon `watch --match 't7\.py'` first; then by hand `torchrun --role trainer --tee 3 t7.py > job.log 2>&1`
# (env FAULT etc.); daemon SIGINT 8 s after the job ends
source /work/bb7/man.sh $1 $2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't7\.py' > out.txt 2> err.txt & ag=$!
sleep 3
timeout 90 torchrun --nproc-per-node 2 --master-port $3 --role trainer --tee 3 /work/bb7/t7.py > job.log 2>&1; rj=$?
sleep 8; kill -INT $ag; wait $ag; echo "job rc=$rj daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
grep -v 'step=' job.log | tail -4 | cut -c1-200
finish
