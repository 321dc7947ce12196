# HF Trainer, tiny random GPT-2 under torchrun; from global step NAN_STEP the loss becomes NaN on every rank
import os, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
class DS(torch.utils.data.Dataset):
    def __len__(self): return 512
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i); ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}
class T(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kw):
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        if self.state.global_step >= int(os.environ.get("OOM_STEP", "20")) and int(os.environ["RANK"]) == 1: raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB. GPU 1 has a total capacity of 79.15 GiB of which 1.20 GiB is free.")
        return loss
m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
args = TrainingArguments(output_dir=os.environ["OUT"], per_device_train_batch_size=4, max_steps=40,
    logging_steps=2, save_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo", learning_rate=1e-3, disable_tqdm=True)
T(model=m, args=args, train_dataset=DS()).train()
