#!/bin/bash
source /work/bb5/man.sh g14 18914
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29614 FAULT=hang_bcast FAULT_RANK=0 FAULT_STEP=8 STEPS=300 \
    python /work/bb5/t5.py > rank-$r.log 2>&1 &
  eval p$r=$!
done
sleep 3
timeout -s INT 50 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --pid $p0 --pid $p1 > out.txt 2> err.txt
echo "watch rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
echo "ranks alive after the agent: $(kill -0 $p0 2>&1 && echo r0) $(kill -0 $p1 2>&1 && echo r1)" | tee -a rc.txt
kill -9 $p0 $p1; wait $p0 $p1
finish
