# The real HF Trainer run behind the logs in this folder (README.md): a tiny random GPT-2 on CPU,
# 64 samples, per-device batch 4, 3 epochs, report_to="none", gloo under torchrun.
# LOGGING=epoch|steps (logging_strategy; steps: logging_steps=4), TQDM=0|1 (disable_tqdm=True|False),
# loss NaN on rank FAULT_RANK (default 1) from global step FAULT_STEP (default 10).
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

FS = int(os.environ.get("FAULT_STEP", "10"))
FR = int(os.environ.get("FAULT_RANK", "1"))
R = int(os.environ.get("RANK", "0"))
LOGGING = os.environ.get("LOGGING", "epoch")


class DS(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}


class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        if R == FR and self.state.global_step >= FS:
            loss = loss * float("nan")
        return loss


torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
args = TrainingArguments(
    output_dir=os.environ.get("OUT", "hf_out"),
    per_device_train_batch_size=4,
    num_train_epochs=3,
    logging_strategy=LOGGING,
    logging_steps=4,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    ddp_backend="gloo",
    learning_rate=1e-3,
    disable_tqdm=os.environ.get("TQDM", "0") != "1",
    dataloader_num_workers=0,
)
T(model=m, args=args, train_dataset=DS(), data_collator=default_data_collator).train()
