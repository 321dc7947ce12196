# l32: `run -- accelerate launch --multi_gpu --mixed_precision no --num_processes 3`, each worker prints "[rank r] step N | loss X",
# NaN on rank 2 from step 10 -> one alert titled "nan_loss" with rank, suspect AND world_size null. ~25 s
. tests/data/blackbox/s40/scripts/repro/setup.sh
FAULT=nan FAULT_RANK=2 FAULT_STEP=10 STEPS=30 $RW accelerate launch --multi_gpu --mixed_precision no --num_processes 3 --main_process_port 29475 $S/acc7.py > out.txt 2> err.txt; echo "rc=$?"; sleep 3
python $S/show.py .; grep -m3 "step 1[01] | loss nan" out.txt; kill $HP
