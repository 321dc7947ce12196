"""A script that cannot start under ``rankwatch run -- torchrun --tee 3`` (black-box s35b, d46).

The user mistyped the script's path: each worker's Python prints CPython's ``can't open file
'...': [Errno 2] No such file or directory`` (Modules/main.c) and exits 2 within its first
moments, before the agent's look at torchrun's children finds it, so its pipeline starts only
when torchrun's failure box names it. Before: "No error was recognised in the log and it printed
nothing" for every rank (the late pipeline read the combined log from its end). Asserted: each
rank's crash quotes the error it printed, and nothing of the job is left running. Both ranks
failed the same way at once (d46's "suspect rank 0" was whichever agent judged first): one
alert, no suspect, the verdict ``same_failure``.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from faultlib import webhook
from torchjobs import REAL_TORCH, agent_config, job_env, rankwatch, read_jsonl, reap_leftovers, torchrun

pytestmark = REAL_TORCH

RUN_S = 120.0  # torchrun imports torch on a busy core; the workers end at once


def test_a_mistyped_script_is_a_crash_that_quotes_pythons_error(tmp_path: Path) -> None:
    found = tmp_path / "f.jsonl"
    missing = tmp_path / "trian.py"
    tag = uuid.uuid4().hex
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        # The default group wait: rank 1's pipeline starts only when torchrun's box names it,
        # up to ~2 s after rank 0's on a busy core; the alert waits that long for its ranks.
        cfg.write_text(cfg.read_text().replace("group_wait: 1s", "group_wait: 5s"))
        cmd = rankwatch("run", "--config", str(cfg), "--findings-jsonl", str(found), "--")
        cmd += [*torchrun(2, "--tee", "3"), str(missing)]
        done = subprocess.run(cmd, env=job_env(tag, {}), capture_output=True, timeout=RUN_S, check=False)
        alerts = [json.loads(body) for body in posted]
    assert reap_leftovers(tag) == []
    assert done.returncode == 1, done.stderr.decode()[-2000:]
    rows = read_jsonl([found])
    crashes = {r["rank"]: r["message"] for r in rows if r["kind"] == "crash"}
    assert sorted(crashes) == [0, 1], rows
    for message in crashes.values():
        assert f"could not open the script '{missing}': [Errno 2] No such file or directory" in message
        assert "printed nothing" not in message
    firing = [a for a in alerts if a["status"] == "firing"]
    assert [(a["kind"], a["suspect"]) for a in firing] == [("crash", None)], (alerts, rows)
    assert firing[0]["diagnosis"]["verdict"] == "same_failure", firing
