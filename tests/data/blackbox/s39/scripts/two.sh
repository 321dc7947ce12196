#!/bin/bash
# two.sh NAME HP RDZVPORT TIMEOUT: two `rankwatch run -- torchrun --nnodes 2 --nproc-per-node 2` agents (two "nodes" on one
# host, c10d rendezvous, rdzv-id = NAME), one dumps dir (their alert board); FAULT etc. from the environment
source /work/bb6/man.sh $1 $2
for n in 0 1; do
  timeout --preserve-status -s INT $4 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --set runner.log_dir=$PWD/logs$n \
    -- torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$3 --rdzv-id $1 --tee 3 /work/bb6/t6.py > out-$n.txt 2> err-$n.txt &
  eval a$n=$!
done
wait $a0; r0=$?; wait $a1; r1=$?
echo "agent rc0=$r0 rc1=$r1 load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
