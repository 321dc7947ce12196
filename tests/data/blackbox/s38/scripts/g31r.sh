#!/bin/bash
# g31's second half again (g31's `truncate -s 50%` was invalid): cut the newest DCP data file, then check
. /work/bb5/env.sh; cd /work/bb5/g30 || exit 1; mkdir -p ../g31r
{ f=$(ls ck/step00030/*.distcp | head -1); echo "truncating $f ($(stat -c %s $f) bytes) to 1500"; truncate -s 1500 $f
  rankwatch checkpoints ck --settle 0; echo "rc=$?"; rankwatch checkpoints ck --settle 0 --json; echo "rc=$?"; } > ../g31r/out.txt 2>&1; cat ../g31r/out.txt
