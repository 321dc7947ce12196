"""Made ``hf_deepspeed_zero0.log``: the HF Trainer under DeepSpeed ZeRO-0 on the CPU.

Run from this folder with DeepSpeed installed:
``DS_ACCELERATOR=cpu PYTHONUNBUFFERED=1 RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1
MASTER_PORT=29534 python hf_deepspeed_zero0.py > hf_deepspeed_zero0.log 2>&1``
"""

import json

import deepspeed
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16))
g = torch.Generator().manual_seed(0)
data = [
    {"input_ids": (ids := torch.randint(0, 64, (16,), generator=g)), "labels": ids.clone()} for _ in range(80)
]
args = TrainingArguments(
    output_dir="out",
    num_train_epochs=1,
    per_device_train_batch_size=2,
    logging_steps=5,
    report_to=[],
    save_strategy="no",
    deepspeed="hf_deepspeed_zero0.ds.json",
    learning_rate=1e-3,
)
t = Trainer(model=model, args=args, train_dataset=data)
t.train()
truth = {
    "scenario": "hf_deepspeed_zero0",
    "format": "hf",
    "total_steps": t.state.max_steps,
    "logged_steps": [e["step"] for e in t.state.log_history if "loss" in e],
    "nan_step": None,
    "healthy": True,
    "deepspeed": deepspeed.__version__,
    "transformers": transformers.__version__,
}
with open("hf_deepspeed_zero0.json", "w") as f:
    json.dump(truth, f, indent=1)
