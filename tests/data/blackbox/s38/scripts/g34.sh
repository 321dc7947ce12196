#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g34; rm -rf $d; mkdir -p $d; cd $d
FAULT=nan CSV=1 STEPS=20 MASTER_PORT=29634 python /work/bb5/pl5.py > pl.log 2>&1; echo "pl rc=$?"
{ head -3 csv/version_0/metrics.csv; grep -n -m2 nan csv/version_0/metrics.csv
  rankwatch analyze --json csv/version_0/metrics.csv; echo "rc=$?"; } > out.txt 2>&1; cat out.txt
