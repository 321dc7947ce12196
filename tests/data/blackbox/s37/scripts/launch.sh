#!/bin/bash
# a user's wrapper: sets env, then runs torchrun (not exec), plain (no --tee)
export OMP_NUM_THREADS=1
echo "launching on $(hostname)"
torchrun --nproc-per-node 2 --master-port ${MP:-29917} "$(dirname "$0")/t4.py"
echo "torchrun finished with $?"
