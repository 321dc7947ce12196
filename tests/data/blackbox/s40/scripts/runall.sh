#!/bin/bash
# runall.sh [FIRST_CELL]: runs cells.txt in order, one at a time, until 01:50 UTC; console of each in console/<cell>.txt
cd /work/bb7; mkdir -p console
start=${1:-}; go=0; [ -z "$start" ] && go=1
while IFS=$'\t' read -r c cmd; do
  [ "$c" = "$start" ] && go=1; [ $go = 1 ] || continue
  if [ "$(date -u +%H%M)" -ge 150 -a "$(date -u +%H)" = 01 ]; then echo "$c SKIPPED (01:50)" >> console/skipped.txt; continue; fi
  echo "=== $c $(date -u +%T) load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a console/runlog.txt
  ( cd /work/bb7 && bash -c "$cmd" ) > console/$c.txt 2>&1 < /dev/null
  echo "    done $(date -u +%T)" | tee -a console/runlog.txt
  # processes started by the cell and still alive after its own leftovers check: recorded there, then ended by pid
  for p in /proc/[0-9]*; do cwd=$(readlink $p/cwd 2>/dev/null); case "$cwd" in /work/bb7/$c|/work/bb7/$c/*) pid=${p#/proc/}; echo "    killing leftover $pid $(tr '\0' ' ' < $p/cmdline | cut -c1-100)" | tee -a console/runlog.txt; kill -9 $pid 2>/dev/null;; esac; done
  # Slurm jobs of this harness's own cluster (SLURM_CONF=/tmp/bb7-slurm) still queued or running: recorded, then cancelled
  q=$(SLURM_CONF=/tmp/bb7-slurm/slurm.conf squeue -h -o %i 2>/dev/null); [ -n "$q" ] && { echo "    cancelling slurm jobs $q" | tee -a console/runlog.txt; SLURM_CONF=/tmp/bb7-slurm/slurm.conf scancel $q; sleep 6; }
done < cells.txt
echo "ALL DONE $(date -u +%T)" | tee -a console/runlog.txt
