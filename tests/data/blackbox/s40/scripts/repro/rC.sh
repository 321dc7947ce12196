# l13: plain `run -- torchrun`, rank 1's loss x1e6 per step from step 12 (reaching float32 overflow, never NaN) -> THREE alerts
# on rank 1 (loss_spike, loss_divergence, nan_loss) for one blow-up. ~20 s
. tests/data/blackbox/s40/scripts/repro/setup.sh
FAULT=infdiv FAULT_STEP=12 STEPS=30 $RW torchrun --nproc-per-node 2 --master-port 29473 $S/t7.py > out.txt 2> err.txt; echo "rc=$?"; sleep 3
python $S/show.py .; kill $HP
