#!/bin/bash
source /work/bb5/man.sh g40 18940
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 't5(lite)?\.py' > out.txt 2> err.txt & ag=$!
sleep 3
mkdir -p A B; chown nobody B
(cd A && FAULT=nan FAULT_STEP=15 STEPS=35 torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29640 --rdzv-id jobA /work/bb5/t5.py > job.log 2>&1) & ja=$!
for r in 0 1; do (cd B && setpriv --reuid=nobody --regid=nogroup --clear-groups env -i HOME=/work/bb5/g40/B RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 TORCHELASTIC_RUN_ID=jobB STEPS=35 sh -c "/usr/bin/python3 /work/bb5/t5lite.py > rank-$r.log 2>&1") & eval jb$r=\$!; done
wait $ja; ra=$?; wait $jb0; rb=$?; wait $jb1
sleep 6; kill -INT $ag; wait $ag; echo "jobA rc=$ra jobB rc=$rb daemon rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
finish
