# HF Trainer, tiny random GPT-2 under torchrun (CPU/gloo), batch s40 (from s39's hf6.py). Env:
#  FAULT=none|nan (rank FAULT_RANK's training loss NaN from global step FAULT_STEP)
#  STEPS, LOG_STEPS, SAVE_STEPS (0: no save), SAVE_LIMIT (save_total_limit), RESUME=1 (resume_from_checkpoint=True), TQDM=1, OUT, STEP_SLEEP
import os, time, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "20")); FR = int(os.environ.get("FAULT_RANK", "1"))
R = int(os.environ.get("RANK", "0")); SS = float(os.environ.get("STEP_SLEEP", "0"))
class DS(torch.utils.data.Dataset):
    def __init__(self, n, off=0): self.n, self.off = n, off
    def __len__(self): return self.n
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i + self.off); ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}
class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        if model.training and SS: time.sleep(SS)
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        if F == "nan" and model.training and R == FR and self.state.global_step >= FS: loss = loss * float("nan")
        return loss
torch.manual_seed(0)
m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
sv = int(os.environ.get("SAVE_STEPS", "0"))
args = TrainingArguments(output_dir=os.environ.get("OUT", "hf_out"), per_device_train_batch_size=4,
    max_steps=int(os.environ.get("STEPS", "40")), logging_steps=int(os.environ.get("LOG_STEPS", "2")),
    save_strategy="steps" if sv else "no", save_steps=sv or 500, save_total_limit=int(os.environ["SAVE_LIMIT"]) if os.environ.get("SAVE_LIMIT") else None,
    report_to=[], use_cpu=True, ddp_backend="gloo", learning_rate=1e-3,
    disable_tqdm=not os.environ.get("TQDM"), dataloader_num_workers=0)
T(model=m, args=args, train_dataset=DS(4096), data_collator=default_data_collator).train(resume_from_checkpoint=bool(os.environ.get("RESUME")))
print(f"rank {R} training finished", flush=True)
