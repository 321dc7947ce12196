#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g36; rm -rf $d; mkdir -p $d; cd /work/bb5/g11
{ ls tl/*/attempt_*/*/*.log; rankwatch analyze --json tl/*/attempt_*/*/*.log; echo "rc=$?"; } > $d/out.txt 2>&1; cat $d/out.txt
