#!/bin/bash
# runs the s39 repro scripts against CODE=/work/bbcode6, one at a time; outputs in /work/bb6/repro-out/
cd /work/wt/bb6; export SLURM_CONF=/tmp/bb6-slurm/slurm.conf
for r in "$@"; do
  s=$(date +%s)
  CODE=/work/bbcode6 HOOKPORT=18$((RANDOM%900+100)) bash -c ". tests/data/blackbox/s39/scripts/repro/setup.sh; . \$S/repro/$r.sh; kill \$HP; rm -rf \$W" > /work/bb6/repro-out/$r.txt 2>&1 < /dev/null
  echo "$r done at $(date -u +%T) in $(( $(date +%s)-s )) s" >> /work/bb6/repro-out/log.txt
done
