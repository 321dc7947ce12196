"""Run a real Hugging Face ``Trainer`` on CPU and keep what it printed, with its truth.

Usage: ``python gen_hf.py SCENARIO OUT_DIR``. Writes ``OUT_DIR/SCENARIO.log`` (the
child's stdout and stderr in one file, as a shell redirect ``> log 2>&1`` leaves them)
and ``OUT_DIR/SCENARIO.json``: what the Trainer itself knows (the global step of every
logged record, the total, the step whose record first held a NaN). A tiny GPT-2 built
from a config (no download), random token data, seconds per run.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

# Every scenario: TrainingArguments overrides and what is injected.
SCENARIOS: dict[str, dict[str, Any]] = {
    # logging every step, eval every 20 steps, the tqdm bar on: the 466/240 run.
    "hf_ls1_eval": {"args": {"logging_steps": 1, "eval_strategy": "steps", "eval_steps": 20}},
    # the same with the NaN injected at global step 40.
    "hf_ls1_nan40": {"args": {"logging_steps": 1, "eval_strategy": "steps", "eval_steps": 20}, "nan_at": 40},
    # logging every 10 steps, gradient accumulation, NaN at 40.
    "hf_ls10_accum_nan40": {
        "args": {"logging_steps": 10, "gradient_accumulation_steps": 2},
        "nan_at": 40,
        "samples": 320,
    },
    # logging every 10 steps, eval each epoch, healthy.
    "hf_ls10_eval": {"args": {"logging_steps": 10, "eval_strategy": "epoch"}},
    # no tqdm at all: the PrinterCallback prints the dicts.
    "hf_notqdm_ls1": {"args": {"logging_steps": 1, "disable_tqdm": True}},
    "hf_notqdm_ls5_nan40": {"args": {"logging_steps": 5, "disable_tqdm": True}, "nan_at": 40},
    # the LR far too high and no warmup: the loss blows up in the first steps.
    "hf_lr5": {
        "args": {"logging_steps": 1, "learning_rate": 5.0, "max_grad_norm": 0.0, "warmup_steps": 0},
        "blowup": True,
    },
}


def _truth_of(history: list[dict[str, Any]], max_steps: int) -> dict[str, Any]:
    train = [h for h in history if "loss" in h and "train_runtime" not in h]
    nan_step = None
    for h in train:
        if any(not math.isfinite(float(h[k])) for k in ("loss", "grad_norm") if k in h):
            nan_step = int(h["step"])
            break
    return {
        "total_steps": max_steps,
        "logged_steps": [int(h["step"]) for h in train],
        "eval_steps": [int(h["step"]) for h in history if "eval_loss" in h],
        "nan_step": nan_step,
    }


def main(name: str, out_dir: str) -> None:
    spec = SCENARIOS[name]
    import torch
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    torch.manual_seed(0)
    vocab = 64
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=vocab, n_positions=16)
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(0)

    def data(n: int) -> list[dict[str, torch.Tensor]]:
        out = []
        for _ in range(n):
            ids = torch.randint(0, vocab, (16,), generator=g)
            out.append({"input_ids": ids, "labels": ids.clone()})
        return out

    nan_at = spec.get("nan_at")

    class InjectNaN(TrainerCallback):
        """Poison a weight just before the optimizer step ``nan_at`` runs its forward."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if nan_at is not None and state.global_step == nan_at - 1:
                with torch.no_grad():
                    model.transformer.wte.weight[0, 0] = float("nan")
                    model.transformer.wte.weight.fill_(float("nan"))

    kwargs: dict[str, Any] = {
        "output_dir": os.path.join(out_dir, f"{name}.out"),
        "num_train_epochs": 3,
        "per_device_train_batch_size": 2,
        "per_device_eval_batch_size": 8,
        "learning_rate": 1e-3,
        "warmup_steps": 10,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "dataloader_num_workers": 0,
        "seed": 0,
    }
    kwargs.update(spec["args"])
    args = TrainingArguments(**kwargs)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data(spec.get("samples", 160)),
        eval_dataset=data(40) if kwargs.get("eval_strategy", "no") != "no" else None,
        callbacks=[InjectNaN()],
    )
    trainer.train()
    sys.stdout.flush()
    truth = _truth_of(trainer.state.log_history, trainer.state.max_steps)
    truth.update(
        scenario=name,
        format="hf",
        healthy=nan_at is None and not spec.get("blowup"),
        blowup=bool(spec.get("blowup")),
        logging_steps=kwargs.get("logging_steps"),
        tqdm=not kwargs.get("disable_tqdm", False),
    )
    Path(out_dir, f"{name}.json").write_text(json.dumps(truth, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
