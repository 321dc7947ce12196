"""``rankwatch run -- torchrun --tee 3 train.py`` on a real Hugging Face Trainer with its tqdm bar
(tests/workloads/hf_trainer.py, CPU, gloo). Each worker's stdout and stderr are files of its own
that the agent reads apart: the Trainer's dicts (``tqdm.write``, stdout) in one, the bar's
clearing and redraw that mark each write (stderr) in the other. s36 d16: live, the dicts got no
step (the stdout reader never saw a bar) and the NaN was told at "step 17" (the 17th record),
where ``analyze`` on the combined log says the Trainer's step 34. Harness: tests/torchjobs.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from torchjobs import agent_config, finish, run_launcher, torchrun, webhook

pytestmark = [
    pytest.mark.tool,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None, reason="transformers not installed (CI installs it)"
    ),
]

WORKLOAD = Path(__file__).parent / "workloads" / "hf_trainer.py"


@pytest.mark.timeout(300)
def test_hf_trainer_nan_under_tee_is_told_at_the_trainers_step(tmp_path: Path) -> None:
    env = {"FAULT": "nan", "FAULT_RANK": "1", "FAULT_STEP": "32", "STEPS": "60", "OUT": str(tmp_path / "hf")}
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        c = finish(run_launcher(tmp_path, cfg, torchrun(2, "--tee", "3"), env, WORKLOAD), tmp_path, posted)
    live = c.on(0, "nan_loss")
    assert live, c.debug()
    # The loss is NaN from the step computed at global step 32 (the 33rd); the Trainer logs
    # every 2 steps: its dict at step 34 is the first NaN one. (``analyze`` on the combined log
    # says the same on an idle node; torchrun's tee cuts the bar's line wherever its reader
    # finds the file's end, so on a loaded one the combined log itself is out of order.)
    assert live[0]["step"] == 34, c.debug()
    assert "counted log records" not in live[0]["message"], c.debug()
