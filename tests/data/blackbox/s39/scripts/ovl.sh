#!/bin/bash
# ovl.sh NAME HP: batch job = plain training step (no rankwatch) + `srun --overlap` node watcher (watch.sbatch style); rank 1 hangs
source /work/bb6/man.sh $1 $2
cat > ovl.sbatch <<'EOS'
#!/bin/bash
#SBATCH -n 2
#SBATCH -o slurm-%j.out
srun -n 2 python /work/bb6/slurm6.py > train-%t.out 2>&1 &
T=$!
srun --overlap -n 1 timeout --preserve-status -s INT 55 rankwatch watch -c cfg.yaml --no-server --findings-jsonl f.jsonl --dumps-dir dumps --match 'slurm6\.py' > watch.out 2> watch.err
echo "watch rc=$?"
kill $T; wait $T; echo "train srun rc=$?"
EOS
FAULT=hang FAULT_STEP=8 STEPS=300 timeout 120 sbatch --wait ovl.sbatch; echo "sbatch rc=$? load=$(cut -d' ' -f1-3 /proc/loadavg) at=$(date -u +%T)" | tee rc.txt
cat slurm-*.out | tail -5; tail -3 watch.err
finish
