#!/bin/bash
# srun7.sh NAME HP MODE: MODE multi: `srun -n 2 --multi-prog multi.conf` (each task line: rankwatch run ... -- python slurm7.py);
# salloc: `salloc -n 2 srun rankwatch run ... -- python slurm7.py`; npn: `srun -N1 --ntasks-per-node 2 rankwatch run ...`
source /work/bb7/man.sh $1 $2
RW="rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- python /work/bb7/slurm7.py"
case $3 in
  multi) printf '0-1 %s\n' "$RW" > multi.conf; timeout 120 srun -n 2 --multi-prog multi.conf > out.txt 2> err.txt; rc=$?;;
  salloc) timeout 120 salloc -n 2 srun $RW > out.txt 2> err.txt; rc=$?;;
  npn) timeout 120 srun -N1 --ntasks-per-node 2 $RW > out.txt 2> err.txt; rc=$?;;
esac
echo "srun rc=$rc load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
grep -v 'step=' out.txt | tail -5 | cut -c1-200; tail -5 err.txt | cut -c1-200
finish
