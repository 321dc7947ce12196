#!/bin/bash
. /work/bb5/env.sh; cd /work/bb5/g30 || exit 1; mkdir -p ../g31
{ rankwatch checkpoints ck; echo "rc=$?"
  f=$(ls ck/step00030/*.distcp | head -1); echo "truncating $f ($(stat -c %s $f) bytes)"; truncate -s 1500 $f
  rankwatch checkpoints ck --settle 0; echo "rc=$?"
  rankwatch checkpoints ck --settle 0 --json; echo "rc=$?"; } > ../g31/out.txt 2>&1; cat ../g31/out.txt
