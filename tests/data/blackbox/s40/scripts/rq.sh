#!/bin/bash
# rq.sh NAME HP: `sbatch --requeue job7.sbatch` (an agent per task), `scontrol requeue <job>` ~12 s in (step ~8), released at once
# (scontrol update StartTime=now); the second run completes. Env STEPS, MASTER_PORT
source /work/bb7/man.sh $1 $2
j=$(sbatch --requeue --parsable /work/bb7/job7.sbatch); echo "job $j"
sleep 12; scontrol requeue $j; echo "requeued at $(date -u +%T)"; sleep 1; scontrol update JobId=$j StartTime=now
t=$(date +%s); while [ -n "$(squeue -h -j $j -o %T)" ] && [ $(( $(date +%s)-t )) -lt 120 ]; do sleep 2; done
echo "job gone after $(( $(date +%s)-t ))s; state $(sacct -n -j $j -o State 2>/dev/null | head -1) load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
for f in slurm-*.out; do echo "== $f"; grep -v 'step=' $f | tail -8 | cut -c1-220; done
finish
