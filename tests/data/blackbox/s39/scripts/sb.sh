#!/bin/bash
# sb.sh NAME HP [sbatch args]: sbatch --wait job6.sbatch from the cell folder (env passes FAULT etc.)
source /work/bb6/man.sh $1 $2; shift 2
timeout 150 sbatch --wait "$@" /work/bb6/job6.sbatch; rc=$?
echo "sbatch rc=$rc load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
for f in slurm-*.out; do echo "== $f"; grep -v 'step=' $f | tail -8 | cut -c1-220; done
finish
