#!/bin/bash
# sidecar.sh NAME HP MPORT: Kubernetes-sidecar style: the pod's command `torchrun --tee 3 t6.py > pod.log 2>&1`; one sidecar
# `watch --match 't6\.py' --log pod.log` started after it (shared PID namespace = same host); rank 1 hangs at step 8
source /work/bb6/man.sh $1 $2
FAULT=hang FAULT_STEP=8 STEPS=300 torchrun --nproc-per-node 2 --master-port $3 --tee 3 /work/bb6/t6.py > pod.log 2>&1 & job=$!
sleep 3
timeout --preserve-status -s INT 55 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't6\.py' --log pod.log > out.txt 2> err.txt; rs=$?
kill -TERM $job; wait $job; echo "sidecar rc=$rs job rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
