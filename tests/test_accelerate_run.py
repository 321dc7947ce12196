"""``rankwatch run -- accelerate launch --multi_gpu --num_processes 2 train.py`` on a real
accelerate job (tests/workloads/accelerate_log.py, CPU, gloo): the script logs through
accelerate's own logger with ``main_process_only=False``, so both processes' lines reach the
launcher's one output marked ``[RANK n]`` (accelerate/logging.py, ``MultiProcessAdapter``) and
no launcher prefix. s36 e18: the NaN of process 1 was found with rank null and no suspect.
Harness: tests/torchjobs.py.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

from conftest import free_port
from torchjobs import agent_config, finish, run_launcher, webhook

pytestmark = [
    pytest.mark.tool,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("accelerate") is None, reason="accelerate not installed (CI installs it)"
    ),
]

WORKLOAD = Path(__file__).parent / "workloads" / "accelerate_log.py"


@pytest.mark.timeout(300)
def test_accelerate_logger_nan_is_found_on_the_rank_its_marker_names(tmp_path: Path) -> None:
    exe = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    launcher = [exe, "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", str(free_port())]
    env = {"FAULT": "nan", "FAULT_RANK": "1", "FAULT_STEP": "15", "STEPS": "25"}
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        c = finish(run_launcher(tmp_path, cfg, launcher, env, WORKLOAD), tmp_path, posted)
    assert c.rc == 0, c.debug()
    nan = {f["rank"]: f["step"] for f in c.of("nan_loss")}
    assert nan.get(1) == 15 and None not in nan, c.debug()
    assert set(nan) <= {0, 1} and nan.get(0, 16) == 16, c.debug()
    [alert] = c.alerts_of("nan_loss")
    assert alert["rank"] == 1 and alert["suspect"] == 1, c.debug()
