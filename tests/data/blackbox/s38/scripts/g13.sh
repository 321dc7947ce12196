#!/bin/bash
source /work/bb5/man.sh g13 18913
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29613 FAULT=slow FAULT_RANK=1 FAULT_STEP=10 SLOW_DELAY=1.5 STEPS=70 \
    timeout -s INT 150 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- python /work/bb5/t5.py > out-$r.txt 2> err-$r.txt &
  eval p$r=$!
done
wait $p0; r0=$?; wait $p1; r1=$?
echo "rc0=$r0 rc1=$r1 load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
