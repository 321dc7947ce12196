# k43: HF Trainer logging_steps 5, NaN from global step 22, plain `run -- torchrun` -> "NaN/Inf at step 5" (trainer step 25)
STEP_SLEEP=0.15 FAULT=nan FAULT_RANK=1 FAULT_STEP=22 LOG_STEPS=5 STEPS=40 rankwatch run -c cfg.yaml --no-server \
  --findings-jsonl f.jsonl --dumps-dir dumps -- torchrun --nproc-per-node 2 --master-port 29313 $S/hf6.py > out.txt 2>&1; sleep 3
python $S/show.py .; grep -m1 "grad_norm': 'nan" out.txt
