"""A real Hugging Face Trainer job (tiny random GPT-2, CPU, gloo) under torchrun, its tqdm bar on.

Each rank trains ``STEPS`` global steps, logging a dict every ``LOG_STEPS`` (``tqdm.write`` to
stdout, the bar's clearing and redraw to stderr). ``FAULT=nan``: from global step
``FAULT_STEP`` rank ``FAULT_RANK``'s loss is NaN (DDP spreads it to the gradients of every
rank). No download: the model is built from a config, the data is random tokens. Derived from
the black-box batch s36's scripts/hf3.py.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

FAULT = os.environ.get("FAULT", "none")
FAULT_STEP = int(os.environ.get("FAULT_STEP", "20"))
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
RANK = int(os.environ.get("RANK", "0"))


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class FaultyTrainer(Trainer):
    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False, **kw: Any) -> Any:
        loss = super().compute_loss(model, inputs, return_outputs, **kw)
        if FAULT == "nan" and RANK == FAULT_RANK and self.state.global_step >= FAULT_STEP:
            loss = loss * float("nan")
        return loss


def main() -> None:
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=os.environ.get("OUT", "hf_out"),
        per_device_train_batch_size=4,
        max_steps=int(os.environ.get("STEPS", "60")),
        logging_steps=int(os.environ.get("LOG_STEPS", "2")),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        learning_rate=1e-3,
        disable_tqdm=False,
        dataloader_num_workers=0,
    )
    trainer = FaultyTrainer(
        model=model, args=args, train_dataset=Tokens(), data_collator=default_data_collator
    )
    trainer.train()


if __name__ == "__main__":
    main()
