#!/bin/bash
# hfres.sh NAME HP MPORT: HF Trainer resume. Run A (plain torchrun, no rankwatch: the earlier job) trains 20 steps saving checkpoint-10/-20;
# run B `rankwatch run -- torchrun --tee 3 hf7.py` with RESUME=1 to 40 steps (env FAULT etc. apply to run B only), tqdm on
source /work/bb7/man.sh $1 $2
STEPS=20 SAVE_STEPS=10 STEP_SLEEP=0.1 torchrun --nproc-per-node 2 --master-port $3 --tee 3 /work/bb7/hf7.py > runA.txt 2>&1; echo "run A rc=$? $(ls hf_out)"
RESUME=1 TQDM=1 STEPS=40 SAVE_STEPS=10 STEP_SLEEP=0.1 timeout --preserve-status -s INT 90 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps -- torchrun --nproc-per-node 2 --master-port $(( $3 + 1 )) --tee 3 /work/bb7/hf7.py > out.txt 2> err.txt
echo "run B rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt; ls hf_out
finish
