"""A ``torch.multiprocessing.spawn`` job under ``rankwatch run``, as a user starts it and stops it.

One script starts its two gloo ranks with ``mp.spawn`` and each child sets RANK in its own
``os.environ`` (tests/workloads/spawn_train.py), so the agent sees one process tree with no rank
in any process's environment. Rank 1 hangs in its own loop at step 10 while rank 0 blocks in
DDP's gradient all-reduce. Asserted: the stall alert names the hung worker by its pid (no rank
is claimed: none was learned), ``rankwatch dumps diff`` says the same process by process, and
the user's Ctrl-C (SIGINT to the agent) ends every process of the job within ``runner.term_grace``
as it would in a terminal, with no KeyboardInterrupt alert and the exit finding naming the
signal that ended it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import free_port, wait_for
from torchjobs import (
    REAL_TORCH,
    RUN_S,
    agent_config,
    job_env,
    job_processes,
    rankwatch,
    read_jsonl,
    reap_leftovers,
    webhook,
)

pytestmark = REAL_TORCH

SPAWN = Path(__file__).parent / "workloads" / "spawn_train.py"
# Long enough for the job to end on the Ctrl-C alone, as in a terminal (gloo's peer notices the
# hung rank's exit and the launcher's join returns: ~8 s on two busy cores), before term_grace's
# SIGKILL would end it instead (tests/test_live.py covers that escalation on its own).
TERM_GRACE_S = 30.0


@pytest.mark.timeout(300)
def test_spawn_hang_names_the_hung_worker_and_ctrl_c_ends_the_whole_job(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    found = tmp_path / "f.jsonl"
    env = job_env(
        tag, {"FAULT": "hang", "FAULT_RANK": "1", "FAULT_STEP": "10", "MASTER_PORT": str(free_port())}
    )
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        cmd = rankwatch(
            "run", "--config", str(cfg), "--set", f"runner.term_grace={TERM_GRACE_S:.0f}s",
            "--findings-jsonl", str(found), "--", sys.executable, str(SPAWN),
        )  # fmt: skip
        with open(tmp_path / "agent.out", "ab") as out:
            agent = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            stalls = wait_for(
                lambda: [f for f in read_jsonl([found]) if f["kind"] == "stall" and not f.get("resolved")],
                RUN_S,
                "the stall",
                0.25,
            )
            wait_for(lambda: '"firing"' in "".join(posted), 30, "the stall's alert", 0.25)
            log = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").glob("*.log"))
            pids = {int(r): int(p) for r, p in re.findall(r"worker rank (\d+) pid (\d+)", log)}
            assert set(pids) == {0, 1}, log[-2000:]

            # The user's Ctrl-C: SIGINT to rankwatch alone (its command runs in a session of its own).
            agent.send_signal(signal.SIGINT)
            t0 = time.monotonic()
            wait_for(
                lambda: not [p for p in job_processes(tag) if p.pid != agent.pid],
                TERM_GRACE_S,
                "every process of the job to end after the user's Ctrl-C",
                0.1,
            )
            ended_s = time.monotonic() - t0
            rc = agent.wait(timeout=60)
        finally:
            if agent.poll() is None:
                agent.kill()
            left = reap_leftovers(tag)
    rows = read_jsonl([found])
    alerts = [json.loads(b) for b in posted]
    debug = f"ended in {ended_s:.1f}s rc={rc}\n{[(f['kind'], f['message'][:300]) for f in rows]}\n{alerts}"
    assert not left, debug
    # As in a terminal: the launcher dies of its own KeyboardInterrupt, status 128+SIGINT.
    assert rc == 130, debug

    stall = stalls[0]
    assert f"suspect: pid {pids[1]} (spawn process 1)" in stall["message"], debug
    assert stall["diagnosis"]["suspect_pids"] == [pids[1]], debug
    assert stall["diagnosis"]["suspect"] is None, debug  # no rank was learned, none is claimed
    fired = [a for a in alerts if a["kind"] == "stall" and a["status"] == "firing"]
    assert len(fired) == 1 and fired[0]["diagnosis"]["suspect_pids"] == [pids[1]], debug
    assert f"suspect: pid {pids[1]} (spawn process 1)" in fired[0]["message"], debug

    # The user's stop is no finding: no KeyboardInterrupt traceback, no crash; the exit says how.
    assert not [f for f in rows if f["kind"] in ("traceback", "crash")], debug
    assert not [a for a in alerts if "KeyboardInterrupt" in json.dumps(a)], debug
    exits = [f for f in rows if f["kind"] == "process_exit"]
    assert exits and "stopped on the SIGINT we forwarded" in exits[-1]["message"], debug

    incident = stall["diagnosis"]["incident"]
    diff = subprocess.run(
        rankwatch("dumps", "diff", "--dir", str(tmp_path / "dumps"), incident),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert diff.returncode == 0, diff.stderr
    text = diff.stdout
    assert f"pid {pids[0]} (spawn process 0): waiting in all_reduce" in text, text
    assert f"pid {pids[1]} (spawn process 1): blocked in a wait of its own" in text, text
    assert f"suspect: pid {pids[1]} (spawn process 1)" in text, text
    assert "no suspect" not in text, text


def _spawn_fault(tmp_path: Path, fault: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """``rankwatch run -- python spawn_train.py`` with ``fault`` on worker 1 at step 10, to its end:
    the findings, the alerts and a debug text; the script exited 1 and left nothing running."""
    tag = uuid.uuid4().hex
    found = tmp_path / "f.jsonl"
    env = job_env(
        tag, {"FAULT": fault, "FAULT_RANK": "1", "FAULT_STEP": "10", "MASTER_PORT": str(free_port())}
    )
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        cmd = rankwatch(
            "run", "--config", str(cfg), "--findings-jsonl", str(found), "--", sys.executable, str(SPAWN)
        )
        with open(tmp_path / "agent.out", "ab") as out:
            agent = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            rc = agent.wait(timeout=RUN_S)
        finally:
            if agent.poll() is None:
                agent.kill()
            left = reap_leftovers(tag)
    rows = read_jsonl([found])
    alerts = [json.loads(b) for b in posted]
    debug = f"rc={rc}\n{[(f['kind'], f['rank'], f['message'][:300]) for f in rows]}\n{alerts}"
    assert not left and rc == 1, debug
    return rows, alerts, debug


@pytest.mark.timeout(300)
def test_spawn_worker_oom_is_one_alert_and_explains_the_scripts_exit(tmp_path: Path) -> None:
    """s36 e25: worker 1 of ``torch.multiprocessing.spawn`` fails a real CPU allocation at step
    10; the script re-raises it (``ProcessRaisedException``) and exits 1. One finding per death:
    the oom on rank 1, and the script's end an info ``process_exit`` naming that oom (no second
    critical ``crash`` saying "No error was recognised"); one alert, the oom on rank 1."""
    rows, alerts, debug = _spawn_fault(tmp_path, "cpuoom")
    serious = [f for f in rows if f["severity"] != "info" and not f.get("resolved")]
    assert [(f["kind"], f["rank"]) for f in serious] == [("oom", 1)], debug
    assert "can't allocate memory" in serious[0]["message"], debug
    [end] = [f for f in rows if f["kind"] == "process_exit" and f["rank"] is None]
    assert end["evidence"]["cause_kind"] == "oom", debug
    assert "rank 1's oom finding above" in end["message"], debug
    firing = [a for a in alerts if a["status"] == "firing"]
    assert [(a["kind"], a["rank"], a["severity"]) for a in firing] == [("oom", 1, "critical")], debug
    assert firing[0]["suspect"] == 1, debug


@pytest.mark.timeout(300)
def test_spawn_worker_sigkill_is_a_crash_of_that_rank_by_signal(tmp_path: Path) -> None:
    """s38 g21: worker 1 of ``torch.multiprocessing.spawn`` is SIGKILLed at step 10; the script
    exits 1 on ``ProcessExitedException: process 1 terminated with signal SIGKILL``. One critical
    finding, rank 1's crash "killed by signal 9 (SIGKILL)" (not the script's "No error was
    recognised"), the script's end an info ``process_exit`` naming it; one alert, on rank 1."""
    rows, alerts, debug = _spawn_fault(tmp_path, "sigkill")
    serious = [f for f in rows if f["severity"] != "info" and not f.get("resolved")]
    assert [(f["kind"], f["rank"]) for f in serious] == [("crash", 1)], debug
    assert "killed by signal 9 (SIGKILL)" in serious[0]["message"], debug
    assert serious[0]["step"] is not None and serious[0]["step"] >= 9, debug
    [end] = [f for f in rows if f["kind"] == "process_exit" and f["rank"] is None]
    assert "rank 1's crash finding above" in end["message"], debug
    firing = [a for a in alerts if a["status"] == "firing"]
    assert [(a["kind"], a["rank"], a["severity"]) for a in firing] == [("crash", 1, "critical")], debug
    # The script's log is the whole job's: rank 1 failed first, and the alert names it.
    assert firing[0]["suspect"] == 1 and firing[0]["summary"].endswith(", suspect rank 1"), debug
    assert firing[0]["diagnosis"]["first_failure"]["rank"] == 1, debug
