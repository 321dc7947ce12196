#!/bin/bash
# twojobs.sh NAME HP PORTA PORTB: node daemon `watch --match 't6\.py'`; two torchrun jobs of one user at once (rdzv-id jobA, jobB),
# rank 0 of EACH goes NaN from step 15 (the same step)
source /work/bb6/man.sh $1 $2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't6\.py' > out.txt 2> err.txt & ag=$!
sleep 3; mkdir -p A B
(cd A && FAULT=nan FAULT_RANK=0 FAULT_STEP=15 STEPS=30 torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$3 --rdzv-id jobA /work/bb6/t6.py > job.log 2>&1) & ja=$!
(cd B && FAULT=nan FAULT_RANK=0 FAULT_STEP=15 STEPS=30 torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$4 --rdzv-id jobB /work/bb6/t6.py > job.log 2>&1) & jb=$!
wait $ja; ra=$?; wait $jb; rb=$?
sleep 6; kill -INT $ag; wait $ag; echo "jobA rc=$ra jobB rc=$rb daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
