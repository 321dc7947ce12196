#!/bin/bash
. /work/bb5/env.sh; d=/work/bb5/g66; rm -rf $d; mkdir -p $d/st; cd $d
python -c "
import torch
from safetensors.torch import save_file
for s in (100, 200, 300): save_file({'w': torch.randn(64, 64), 'b': torch.randn(64)}, f'st/model-step{s}.safetensors')
"
sleep 2
{ rankwatch checkpoints st --step-regex 'step(\d+)'; echo "rc=$?"; truncate -s 5000 st/model-step300.safetensors; sleep 2
  rankwatch checkpoints st --step-regex 'step(\d+)' --settle 1; echo "rc=$?"; } > out.txt 2>&1; cat out.txt
