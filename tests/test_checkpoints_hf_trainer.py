"""A real Hugging Face Trainer run on CPU writes the checkpoints; rankwatch must judge them good.

The other checkpoint tests imitate the Trainer's files; this one catches the day the
Trainer's layout moves on (new files, another weights format, a different state file).
Tiny model built from a local config, random token data, no downloads. Runs in a child
process so transformers' import-time settings stay out of the other tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rankwatch.checkpoints import CheckpointConfig
from rankwatch.checkpoints import layouts as L
from rankwatch.checkpoints.catalog import Catalog
from rankwatch.records import StepRecord

pytestmark = [pytest.mark.tool, pytest.mark.torch, pytest.mark.timeout(120)]

TRAIN = textwrap.dedent(
    """
    import sys
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(8):
        ids = torch.randint(0, 64, (16,), generator=g)
        data.append({"input_ids": ids, "labels": ids.clone()})
    args = TrainingArguments(
        output_dir=sys.argv[1], max_steps=4, save_steps=2, save_strategy="steps", logging_steps=1,
        per_device_train_batch_size=2, report_to=[], use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, save_total_limit=5,
    )
    Trainer(model=model, args=args, train_dataset=data).train()
    """
)


def _train(out: Path) -> None:
    for mod in ("torch", "transformers", "accelerate"):
        pytest.importorskip(mod, reason=f"{mod} not installed: the real HF Trainer test needs it")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", WANDB_DISABLED="true")
    proc = subprocess.run(
        [sys.executable, "-c", TRAIN, str(out)], env=env, capture_output=True, text=True, timeout=100
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_real_trainer_checkpoints_are_judged_good(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _train(out)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]

    proc = subprocess.run(
        [sys.executable, "-m", "rankwatch", "checkpoints", str(out), "--json", "--settle", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    rows = [(c["name"], c["step"], c["layout"], c["status"], c["resumable"]) for c in doc["checkpoints"]]
    assert rows == [
        ("checkpoint-2", 2, "hf", "good", True),
        ("checkpoint-4", 4, "hf", "good", True),
    ], doc
    assert doc["newest_is_good"] is True and doc["last_good"]["name"] == "checkpoint-4"

    cat = Catalog(out, CheckpointConfig(settle=0.0), oneshot=True)
    assert cat.update(L.scan(out)) == []  # nothing found wrong: not even a note-level finding
    assert cat.last_good() is cat.newest_judged() and cat.last_good().name == "checkpoint-4"
    steps = [r.step for r in cat.new_history() if isinstance(r, StepRecord)]
    assert steps == [1, 2, 3, 4]  # log_history with the Trainer's own step numbers
