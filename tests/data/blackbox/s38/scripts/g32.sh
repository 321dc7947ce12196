#!/bin/bash
. /work/bb5/env.sh; mkdir -p /work/bb5/g32; cd /work/bb5/g27 || exit 1
{ rankwatch checkpoints hf_out; echo "rc=$?"; rankwatch checkpoints hf_out --bad-from 25; echo "rc=$?"; } > ../g32/out.txt 2>&1; cat ../g32/out.txt
