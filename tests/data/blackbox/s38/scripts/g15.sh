#!/bin/bash
source /work/bb5/man.sh g15 18915
for r in 0 1; do
  timeout -s INT 80 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match "t5.py tag=r$r" --log rank-$r.log > out-$r.txt 2> err-$r.txt &
  eval a$r=$!
done
sleep 4
for r in 0 1; do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29615 FAULT=nan FAULT_STEP=15 STEPS=30 \
    python /work/bb5/t5.py tag=r$r > rank-$r.log 2>&1 &
  eval p$r=$!
done
wait $p0 $p1; echo "job done $(date -u +%T)"
sleep 6; kill -INT $a0 $a1; wait $a0; r0=$?; wait $a1; r1=$?
echo "sidecar rc0=$r0 rc1=$r1 load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
