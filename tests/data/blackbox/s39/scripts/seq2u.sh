#!/bin/bash
# seq2u.sh NAME HP MPORT: node daemon; user nobody's 2-rank job (torch-free stand-in, run jobN) ends, then root's torchrun job
# on the same rank numbers (rdzv-id jobR), NaN on rank 1 from step 15
source /work/bb6/man.sh $1 $2
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't5lite\.py|t6\.py' > out.txt 2> err.txt & ag=$!
sleep 3
mkdir -p N R; chown nobody N
for r in 0 1; do (cd N && setpriv --reuid=nobody --regid=nogroup --clear-groups env -i HOME=$PWD RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 TORCHELASTIC_RUN_ID=jobN STEPS=30 sh -c "/usr/bin/python3 /work/bb6/t5lite.py > rank-$r.log 2>&1") & eval jn$r=\$!; done
wait $jn0; wait $jn1; echo "job N done $(date -u +%T)"
sleep 2
(cd R && FAULT=nan FAULT_STEP=15 STEPS=30 torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:$3 --rdzv-id jobR /work/bb6/t6.py > job.log 2>&1); rr=$?
echo "job R done rc=$rr $(date -u +%T)"
sleep 6; kill -INT $ag; wait $ag; echo "daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
