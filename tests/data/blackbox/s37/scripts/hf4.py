# HF Trainer, tiny random GPT-2: report_to="none", logging_strategy="epoch", 3 epochs of 8 steps (2 ranks x bs 4, 64 samples).
# FAULT=nan: loss NaN on rank FAULT_RANK from global step FAULT_STEP (HF's default logging_nan_inf_filter=True).
import os, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "10")); FR = int(os.environ.get("FAULT_RANK", "1"))
R = int(os.environ.get("RANK", "0"))
class DS(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i); ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}
class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        if F == "nan" and R == FR and self.state.global_step >= FS: loss = loss * float("nan")
        return loss
m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
args = TrainingArguments(output_dir="hf_out", per_device_train_batch_size=4, num_train_epochs=3,
    logging_strategy="epoch", save_strategy="no", report_to="none", use_cpu=True, ddp_backend="gloo",
    learning_rate=1e-3, disable_tqdm=True, dataloader_num_workers=0)
T(model=m, args=args, train_dataset=DS(), data_collator=default_data_collator).train()
