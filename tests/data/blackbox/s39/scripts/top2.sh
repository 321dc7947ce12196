#!/bin/bash
# top2.sh NAME HP RDZVPORT LISTENBASE: two "node" agents with servers on loopback; `rankwatch top --once` on both mid-run (NaN on rank 3)
source /work/bb6/man.sh $1 $2
for n in 0 1; do
  timeout --preserve-status -s INT 60 rankwatch run -c cfg.yaml --listen 127.0.0.1:$(( $4 + n )) --findings-jsonl f.jsonl --dumps-dir dumps --set runner.log_dir=$PWD/logs$n \
    -- torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$3 --rdzv-id $1 --tee 3 /work/bb6/t6.py > out-$n.txt 2> err-$n.txt &
  eval a$n=$!
done
for i in $(seq 1 80); do grep -qs 'step=20 ' logs0/* logs1/* && break; sleep 0.5; done
echo "top at $(date -u +%T)"
COLUMNS=160 rankwatch top --once http://127.0.0.1:$4 http://127.0.0.1:$(( $4 + 1 )) > top.txt 2> top.err; echo "top rc=$?"; cat top.txt top.err | cut -c1-200
for n in 0 1; do curl -s http://127.0.0.1:$(( $4 + n ))/metrics > metrics-$n.txt; done; grep -h 'rank="3"' metrics-*.txt | head -5 | cut -c1-200
wait $a0; r0=$?; wait $a1; r1=$?
echo "agent rc0=$r0 rc1=$r1 load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
