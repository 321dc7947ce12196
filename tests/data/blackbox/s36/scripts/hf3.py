# HF Trainer, tiny random GPT-2 under torchrun. FAULT=nan: from global step FAULT_STEP the loss is NaN on rank FAULT_RANK
# (DDP spreads it). FAULT=hang_collate: rank FAULT_RANK blocks in the data collator at FAULT_STEP. FAULT=crash_cb: a
# callback raises on rank FAULT_RANK at FAULT_STEP. NANFILTER=0 -> logging_nan_inf_filter=False. TQDM=1 -> bars on.
import os, time, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, TrainerCallback, default_data_collator
F = os.environ.get("FAULT", "none"); FS = int(os.environ.get("FAULT_STEP", "20")); FR = int(os.environ.get("FAULT_RANK", "1"))
R = int(os.environ.get("RANK", "0"))
class DS(torch.utils.data.Dataset):
    def __len__(self): return 4096
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i); ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}
class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        if F == "nan" and R == FR and self.state.global_step >= FS: loss = loss * float("nan")
        return loss
n = {"k": 0}
def collate(b):
    n["k"] += 1
    if F == "hang_collate" and R == FR and n["k"] == FS:
        print(f"rank {R} collator waiting for tokenizer server", flush=True)
        while True: time.sleep(1)
    return default_data_collator(b)
class CB(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        if F == "crash_cb" and R == FR and state.global_step == FS:
            raise ValueError(f"eval hook failed: metric 'bleu' got empty predictions at step {state.global_step}")
m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
args = TrainingArguments(output_dir=os.environ.get("OUT", "hf_out"), per_device_train_batch_size=4,
    max_steps=int(os.environ.get("STEPS", "60")), logging_steps=int(os.environ.get("LOG_STEPS", "2")), save_strategy="no",
    report_to=[], use_cpu=True, ddp_backend="gloo", learning_rate=1e-3, disable_tqdm=not os.environ.get("TQDM"),
    logging_nan_inf_filter=os.environ.get("NANFILTER", "1") == "1", log_level=os.environ.get("HFLOGLEVEL", "passive"),
    dataloader_num_workers=0)
T(model=m, args=args, train_dataset=DS(), data_collator=collate, callbacks=[CB()]).train()
