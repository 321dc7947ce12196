# k63: node daemon next to a plain Slurm step (`SLURM_TEST_DIR=/tmp/bb6-slurm bash $S/slurm-up.sh` first, then
# `export SLURM_CONF=/tmp/bb6-slurm/slurm.conf`), rank 1 os.abort() -> alerts "crash" (run default, no rank) + "peer_error on rank 0"
set -m
rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 'slurm6\.py' > out.txt 2>&1 & ag=$!
sleep 3; FAULT=abort FAULT_STEP=10 STEPS=30 MASTER_PORT=29315 srun -n 2 python $S/slurm6.py > train.out 2>&1
sleep 8; kill -INT $ag; wait $ag; sleep 1
python $S/show.py .
