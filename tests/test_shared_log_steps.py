"""A plain torchrun job's one log (no ``--tee``): every worker prints its step lines into it with
no prefix, each line saying its rank (``step=39 loss=2.94673 lr=0.01 rank=1``, the s37 batch's
t4.py). Each rank's crash is told at that rank's last printed step, whether the agent launched
the job (``run -- torchrun``, s37 f02) or attached to its workers mid-run (``watch --pid W0 --pid
W1``, s37 f34), on real PyTorch (CPU, gloo; tests/workloads/ddp_train.py with ``SAY_RANK=1``)."""

from __future__ import annotations

import contextlib
import re
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import wait_for
from torchjobs import (
    REAL_TORCH,
    WORKLOAD,
    Running,
    _popen,
    _term_groups,
    agent_config,
    finish,
    job_env,
    rankwatch,
    run_launcher,
    torchrun,
    webhook,
)

pytestmark = REAL_TORCH


def _last_step(log: str, rank: int) -> int:
    steps = [int(m) for m in re.findall(rf"step=(\d+) [^\n]*?rank={rank}(?!\d)", log)]
    assert steps, log[-3000:]
    return max(steps)


@pytest.mark.timeout(300)
def test_plain_torchrun_a_crash_is_told_at_its_ranks_last_step(tmp_path: Path) -> None:
    """s37 f02: `rankwatch run -- torchrun --nproc-per-node 2 train.py`, rank 0 raises at step 8
    having printed ``step=7 ... rank=0``: its crash is "after step 7", not step null (its step lines
    reach the run's lines only; the ones naming rank 0 are rank 0's)."""
    env = {"FAULT": "raise", "FAULT_RANK": "0", "FAULT_STEP": "8", "STEPS": "30", "SAY_RANK": "1"}
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        c = finish(run_launcher(tmp_path, cfg, torchrun(2), env), tmp_path, posted)
    assert c.rc == 1, c.debug()
    assert "rank 0 hit a bad batch at step 8" in c.log and _last_step(c.log, 0) == 7, c.debug()
    [crash] = c.on(0, "crash")
    assert crash["step"] == 7, c.debug()
    assert "rank 0 hit a bad batch at step 8" in crash["message"], c.debug()
    [alert] = c.alerts_of("crash")
    assert alert["suspect"] == 0, c.debug()


@pytest.mark.timeout(300)
def test_watch_pid_attached_mid_run_tells_a_crash_at_its_ranks_last_step(tmp_path: Path) -> None:
    """s37 f34: `torchrun --nproc-per-node 2 train.py > job.log 2>&1` started by hand, `rankwatch
    watch --pid W0 --pid W1` attached once both ranks printed steps, and rank 1 raises only after
    the agent read the log back and a few more steps came: rank 1's crash is told at its last
    printed step, not at the step where the agent's read-back of the log ended."""
    tag = uuid.uuid4().hex
    gate = tmp_path / "gate"
    log = tmp_path / "job.log"
    found = tmp_path / "f.jsonl"
    env = {"FAULT": "raise", "FAULT_RANK": "1", "FAULT_STEP": "1", "STEPS": "3000", "SAY_RANK": "1"}
    env["FAULT_GATE"] = str(gate)
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        job = _popen([*torchrun(2), str(WORKLOAD), f"--rw-job={tag}"], job_env(tag, env), log, session=True)
        try:

            def printed(rank: int) -> int:
                return len(re.findall(rf"rank={rank}\n", log.read_text(errors="replace")))

            def workers() -> list[int]:
                out = []
                with contextlib.suppress(psutil.Error):
                    for k in psutil.Process(job.pid).children():  # the ranks, not their loaders
                        with contextlib.suppress(psutil.Error):
                            if "RANK" in k.environ():
                                out.append(k.pid)
                return sorted(out)

            wait_for(lambda: printed(1) >= 5 and printed(0) >= 5, 120, "both ranks' first steps", 0.05)
            cmd = rankwatch("-v", "watch", "--config", str(cfg), "--findings-jsonl", str(found))
            for p in workers():
                cmd += ["--pid", str(p)]
            out = tmp_path / "agent.out"
            agent = _popen(cmd, job_env(tag, {}), out)
            replayed = re.compile(
                r"rank (\d): replayed the last \d+ lines of \S+: \d+ steps, last step (\d+)"
            )

            def read_back() -> bool:
                return {m[0] for m in replayed.findall(out.read_text(errors="replace"))} == {"0", "1"}

            wait_for(read_back, 120, "the agent's read-back of job.log", 0.1)
            since = printed(1)
            wait_for(lambda: printed(1) >= since + 5, 120, "rank 1's steps after the attach", 0.05)
            gate.touch()
        except BaseException:
            _term_groups([job])
            raise
        running = Running(
            tag, [job], job.poll, lambda: _term_groups([job]), [found], lambda: [log], [out], [agent]
        )  # fmt: skip
        c = finish(running, tmp_path, posted)
    raised = re.search(r"rank 1 hit a bad batch at step (\d+)", c.log)
    assert raised is not None, c.debug()
    last = _last_step(c.log, 1)
    assert last == int(raised[1]) - 1, c.debug()
    back = {int(r): int(s) for r, s in replayed.findall(out.read_text(errors="replace"))}
    assert back[1] < last, c.debug()  # attached mid-run: steps came after the read-back
    [crash] = c.on(1, "crash")
    assert crash["step"] == last, c.debug()
    assert not c.on(0, "crash"), c.debug()
    [alert] = c.alerts_of("crash")
    assert alert["suspect"] == 1 and alert["rank"] == 1, c.debug()
