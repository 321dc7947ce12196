#!/bin/bash
source /work/bb5/man.sh g16 18916
FAULT=nan FAULT_STEP=15 STEPS=40 torchrun --nproc-per-node 2 --master-port 29616 --redirects 3 --log-dir tl /work/bb5/t5.py > job.log 2>&1 & tr=$!
for i in $(seq 40); do ls tl/*/attempt_0/1/stderr.log >/dev/null 2>&1 && break; sleep 0.5; done
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps $(for f in tl/*/attempt_0/0/stdout.log tl/*/attempt_0/0/stderr.log tl/*/attempt_0/1/stdout.log tl/*/attempt_0/1/stderr.log; do echo --log $f; done) > out.txt 2> err.txt & ag=$!
wait $tr; echo "job rc=$?" | tee rc.txt
sleep 5; kill -INT $ag; wait $ag; echo "watch rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee -a rc.txt
finish
