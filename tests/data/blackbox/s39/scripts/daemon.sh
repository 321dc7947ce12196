#!/bin/bash
# daemon.sh NAME HP MPORT: node daemon `watch --match 't6\.py'` started first; a hand-started `torchrun --redirects 3 --log-dir tl`
# job (env: FAULT, NUM_WORKERS, ...); daemon stopped (SIGINT) 8 s after the job ends
source /work/bb6/man.sh $1 $2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't6\.py' > out.txt 2> err.txt & ag=$!
sleep 3
torchrun --nproc-per-node 2 --master-port $3 --redirects 3 --log-dir tl /work/bb6/t6.py > job.log 2>&1; rj=$?
sleep 8; kill -INT $ag; wait $ag; echo "job rc=$rj daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
