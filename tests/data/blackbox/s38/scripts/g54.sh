#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g54; rm -rf $d; mkdir -p $d; cd $d
{ rankwatch dumps list --dir /work/bb5/g03/dumps; echo "rc=$?"; i=$(ls -d /work/bb5/g03/dumps/*/*_stall* | head -1)
  rankwatch dumps show $i --rank 1 | head -40; echo "rc=$?"; } > out.txt 2>&1; cat out.txt
