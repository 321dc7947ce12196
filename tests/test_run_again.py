"""`rankwatch run` again in the same folder after a crash: the second job's crash pages too.

The alert state file (``alerts.spool_dir``) lets an agent restarted beside a running job keep
its alerts; but an agent under ``run`` starts its job itself, so what the file holds is an
earlier job's. Before: the rerun of a job that crashed the same way within
``INHERIT_HOLD_S`` (20 min) sent nothing at all, the crash "already sent".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faultlib import webhook

pytestmark = pytest.mark.process

CRASH = "import sys; print('step 1 loss 0.5', flush=True); raise RuntimeError('bad shard 7')"


def test_a_crash_of_a_second_run_in_the_same_folder_pages_again(tmp_path: Path) -> None:
    with webhook() as (url, posted):
        cfg = tmp_path / "rw.yaml"
        cfg.write_text(
            f"alerts: {{startup_quiet: 0s, group_wait: 0.5s, spool_dir: {tmp_path / 'spool'},"
            f" webhook: {{urls: ['{url}']}}}}\n"
            f"dumps: {{dir: {tmp_path / 'dumps'}}}\n"
            f"runner: {{log_dir: {tmp_path / 'logs'}, echo: false}}\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "RANKWATCH", "SLURM"))}
        cmd = [sys.executable, "-m", "rankwatch", "run", "-c", str(cfg), "--no-server", "--", sys.executable]
        for _ in range(2):
            done = subprocess.run([*cmd, "-c", CRASH], env=env, capture_output=True, timeout=60, check=False)
            assert done.returncode == 1, done.stderr.decode()[-2000:]
        alerts = [json.loads(body) for body in posted]
    firing = [a for a in alerts if a["status"] == "firing"]
    assert [a["kind"] for a in firing] == ["crash", "crash"], alerts
    assert all("bad shard 7" in a["message"] for a in firing), alerts
    assert firing[0]["id"] != firing[1]["id"]
