# healthy HF Trainer run: tiny random GPT-2, random tokens, DDP over gloo on CPU under torchrun
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
class DS(torch.utils.data.Dataset):
    def __len__(self): return 512
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i); ids = torch.randint(0, 128, (32,), generator=g)
        return {"input_ids": ids, "labels": ids}
m = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
args = TrainingArguments(output_dir="/work/bb2/hf_out2", per_device_train_batch_size=4, max_steps=60,
    logging_steps=2, save_strategy="no", report_to=[], use_cpu=True, ddp_backend="gloo", learning_rate=1e-3, disable_tqdm=False)
Trainer(model=m, args=args, train_dataset=DS()).train()
