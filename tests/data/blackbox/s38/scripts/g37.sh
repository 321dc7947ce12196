#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g37; rm -rf $d; mkdir -p $d; cd $d
{ for c in g04 g05; do i=$(ls -d /work/bb5/$c/dumps/*/*_stall* | head -1); echo "== $c $i"
  rankwatch dumps diff $i; echo "rc=$?"; rankwatch dumps diff --json $i; echo "rc=$?"; done; } > out.txt 2>&1; cat out.txt
