#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g33; rm -rf $d; mkdir -p $d; cd $d
CKPT=1 STEPS=20 MASTER_PORT=29633 python /work/bb5/pl5.py > pl.log 2>&1; echo "pl rc=$?"
{ ls -l ckpts; rankwatch checkpoints ckpts; echo "rc=$?"; truncate -s 2000 'ckpts/step=20.ckpt'; sleep 3
  rankwatch checkpoints ckpts --settle 1; echo "rc=$?"; } > out.txt 2>&1; cat out.txt
