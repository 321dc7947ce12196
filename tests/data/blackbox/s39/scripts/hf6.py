# HF Trainer, tiny random GPT-2 under torchrun (CPU/gloo), batch s39 (hf5.py + COMPILE=1: TrainingArguments(torch_compile=True)). Env:
#  FAULT=none|nan (rank FAULT_RANK's training loss NaN from global step FAULT_STEP)|oom_eval (rank FAULT_RANK raises torch.OutOfMemoryError in its first eval pass at/after FAULT_STEP)
#  LR (learning rate; 1e-3 default; a far too high one diverges), STEPS, LOG_STEPS, EVAL_STEPS (0: no eval), SAVE_STEPS (0: no save)
#  ACCUM (gradient_accumulation_steps), EVAL_DELAY (seconds per eval batch: a slow eval), TQDM=1, OUT
import os, time, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "20")); FR = int(os.environ.get("FAULT_RANK", "1"))
R = int(os.environ.get("RANK", "0")); ED = float(os.environ.get("EVAL_DELAY", "0")); SS = float(os.environ.get("STEP_SLEEP", "0"))  # s39: seconds per training step
class DS(torch.utils.data.Dataset):
    def __init__(self, n, off=0): self.n, self.off = n, off
    def __len__(self): return self.n
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i + self.off); ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}
class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        if not model.training:
            if ED: time.sleep(ED)
            if F == "oom_eval" and R == FR and self.state.global_step >= FS:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.50 GiB. GPU 1 has a total capacity of 79.10 GiB of which 1.12 GiB is free. Of the allocated memory 74.31 GiB is allocated by PyTorch, and 2.07 GiB is reserved by PyTorch but unallocated.")
        if model.training and SS: time.sleep(SS)
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        if F == "nan" and model.training and R == FR and self.state.global_step >= FS: loss = loss * float("nan")
        return loss
m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
ev = int(os.environ.get("EVAL_STEPS", "0")); sv = int(os.environ.get("SAVE_STEPS", "0"))
args = TrainingArguments(output_dir=os.environ.get("OUT", "hf_out"), per_device_train_batch_size=4, per_device_eval_batch_size=4,
    max_steps=int(os.environ.get("STEPS", "60")), logging_steps=int(os.environ.get("LOG_STEPS", "2")),
    eval_strategy="steps" if ev else "no", eval_steps=ev or None,
    save_strategy="steps" if sv else "no", save_steps=sv or 500,
    gradient_accumulation_steps=int(os.environ.get("ACCUM", "1")),
    report_to=[], use_cpu=True, ddp_backend="gloo", learning_rate=float(os.environ.get("LR", "1e-3")),
    disable_tqdm=not os.environ.get("TQDM"), dataloader_num_workers=0, torch_compile=bool(os.environ.get("COMPILE")))
T(model=m, args=args, train_dataset=DS(4096), eval_dataset=DS(int(os.environ.get("EVAL_N", "32")), 10**6), data_collator=default_data_collator).train()
