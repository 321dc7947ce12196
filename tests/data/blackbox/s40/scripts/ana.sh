#!/bin/bash
# ana.sh NAME SRCCELL 'command run in /work/bb7/SRCCELL' : an offline rankwatch command on an earlier cell's output
. /work/bb7/env.sh
d=/work/bb7/$1; rm -rf $d; mkdir -p $d; cd /work/bb7/$2 || exit 1
echo "$3" > $d/cmd.txt
bash -c "$3" > $d/out.txt 2> $d/err.txt; echo "rc=$? at=$(date -u +%T)" | tee $d/rc.txt
head -c 6000 $d/out.txt; echo; head -c 1500 $d/err.txt
