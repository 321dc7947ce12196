# C (g42): a healthy accelerate run whose first logged loss is low -> loss_spike + loss_divergence warnings
ACCUM=4 STEPS=60 rankwatch run -c cfg.yaml --no-server --findings-jsonl f.jsonl -- accelerate launch --multi_gpu --num_processes 2 --main_process_port 29904 $S/acc5.py > out.txt 2>&1; sleep 2; python $S/show.py . | grep -A5 -- '--- hook'
