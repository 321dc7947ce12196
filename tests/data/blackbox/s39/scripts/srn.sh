#!/bin/bash
# srn.sh NAME HP [srun args]: `srun <args> rankwatch run -- python slurm6.py` straight from the shell (an agent per task)
source /work/bb6/man.sh $1 $2; shift 2
timeout 120 srun "$@" rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- python /work/bb6/slurm6.py > out.txt 2> err.txt; rc=$?
echo "srun rc=$rc load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
grep -v 'step=' out.txt | tail -5 | cut -c1-200; tail -5 err.txt | cut -c1-200
finish
