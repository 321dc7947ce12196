#!/bin/bash
# hand-launch N ranks of t3.py in the current folder: handlaunch.sh N PORT [append]  -> rank-<r>.log, pids in pids.txt
export PATH=/work/venv/bin:$PATH PYTHONPATH=/work/bb3
n=$1; port=$2; : > pids.txt
for r in $(seq 0 $((n-1))); do
  if [ "$3" = append ]; then RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port python /work/bb3/t3.py >> rank-$r.log 2>&1 &
  else RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port python /work/bb3/t3.py > rank-$r.log 2>&1 & fi
  echo $! >> pids.txt
done
