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

from rankwatch.analyze import analyze
from rankwatch.config.schema import Config
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
def test_hf_trainer_nan_under_tee_is_told_at_the_trainers_step_as_analyze_tells_it(tmp_path: Path) -> None:
    env = {"FAULT": "nan", "FAULT_RANK": "1", "FAULT_STEP": "32", "STEPS": "60", "OUT": str(tmp_path / "hf")}
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        c = finish(run_launcher(tmp_path, cfg, torchrun(2, "--tee", "3"), env, WORKLOAD), tmp_path, posted)
    live = c.on(0, "nan_loss")
    assert live, c.debug()
    combined = next((tmp_path / "logs").glob("rank-0*.log"))
    offline = [f for f in analyze([str(combined)], Config(), jobs=1).findings if f.kind == "nan_loss"]
    assert offline and offline[0].rank == 0, c.debug()
    # The Trainer's global step (a dict every 2 steps, the NaN from step 32), live as offline.
    assert 32 <= live[0]["step"] <= 36 and live[0]["step"] == offline[0].step, (offline[0].step, c.debug())
    assert "counted log records" not in live[0]["message"], c.debug()
