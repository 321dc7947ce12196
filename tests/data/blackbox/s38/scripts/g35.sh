#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g35; rm -rf $d; mkdir -p $d; cd $d
L=$(ls /work/bb5/g09/logs/*.log | head -1); echo "log: $L"; gzip -c $L > job.log.gz
{ rankwatch analyze --json job.log.gz; echo "rc=$?"; cat $L | rankwatch analyze --json -; echo "rc=$?"; } > out.txt 2>&1; cat out.txt
