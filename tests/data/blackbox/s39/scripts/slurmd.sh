#!/bin/bash
# slurmd.sh NAME HP MPORT: node daemon `watch --match 'slurm6\.py'` next to a plain Slurm step `srun -n 2 python slurm6.py`
# (no rankwatch in the step); rank 1 os.abort() at step 10
source /work/bb6/man.sh $1 $2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 'slurm6\.py' > out.txt 2> err.txt & ag=$!
sleep 3
FAULT=abort FAULT_STEP=10 STEPS=30 MASTER_PORT=$3 timeout 90 srun -n 2 python /work/bb6/slurm6.py > train.out 2>&1; rs=$?
sleep 8; kill -INT $ag; wait $ag; echo "srun rc=$rs daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
grep -v 'step=' train.out | tail -4 | cut -c1-200
finish
