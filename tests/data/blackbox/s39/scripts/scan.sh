#!/bin/bash
# scan.sh NAME HP MODE(plain|batchterm): healthy long sbatch job, stopped with scancel after step 10
source /work/bb6/man.sh $1 $2
jid=$(STEPS=400 sbatch --parsable /work/bb6/job6.sbatch)
for i in $(seq 1 120); do grep -qs 'step=10 ' slurm-$jid.out && break; sleep 0.5; done
echo "scancel at $(date -u +%T)"
if [ "$3" = plain ]; then scancel $jid; else scancel --batch --signal=TERM $jid; fi
for i in $(seq 1 60); do squeue -h -j $jid 2>/dev/null | grep -q . || break; sleep 1; done
echo "job $jid gone at $(date -u +%T) state=$(scontrol show job $jid 2>/dev/null | grep -o 'JobState=[A-Z_]*')" | tee rc.txt
grep -v 'step=' slurm-$jid.out | tail -8 | cut -c1-220
finish
