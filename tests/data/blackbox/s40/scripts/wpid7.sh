#!/bin/bash
# wpid7.sh NAME HP MPORT: `setsid nohup torchrun --tee 3 t7.py > job.log 2>&1 &` started by hand (rank 0 saves ck/stepNNNNN.pt every 5 steps,
# the step-15 save cut to 0 bytes), 5 s later `watch --pid <torchrun pid> --checkpoint-dir ck --set checkpoints.corrupt_after=5s`; agent SIGINT 8 s after the job ends
source /work/bb7/man.sh $1 $2
CKPT_EVERY=5 CKPT_ZERO=15 STEPS=40 setsid nohup torchrun --nproc-per-node 2 --master-port $3 --tee 3 /work/bb7/t7.py > job.log 2>&1 < /dev/null & 
sleep 1; job=$(pgrep -f "master-port $3 --tee 3" | head -1); echo "torchrun pid $job"
sleep 4
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --pid $job --checkpoint-dir ck --set checkpoints.corrupt_after=5s > out.txt 2> err.txt & ag=$!
while kill -0 $job 2>/dev/null; do sleep 1; done; sleep 8
kill -INT $ag; wait $ag; echo "watch rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
ls -la ck | cut -c1-120; grep -v 'step=' job.log | tail -3 | cut -c1-200
finish
