"""``rankwatch run -- torchrun`` across jobs, on real PyTorch (CPU, gloo; harness
tests/torchjobs.py): which run a job is, and what one job leaves in the run folder for the
next.

- The run of a torchrun job is torchrun's run id (``TORCHELASTIC_RUN_ID``, ``--rdzv-id`` or
  the id standalone torchrun makes), as the README says ("the run name defaults to
  SLURM_JOB_ID or the torchrun run id"): every finding, alert and incident folder carries it,
  so two jobs of one user on a node are two runs, not both ``default``.
- Two jobs at once on one host (the same user, the same ``runner.log_dir``) never share the
  log file their agents write and follow: the second takes ``rank-0.<its pid>.log``.
- A healthy job leaves no failure record in the run folder (a clean exit is only a possible
  first failure while peers go on), and a job in the same place (the same run name) is judged
  on its own records only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import free_port, wait_for
from torchjobs import REAL_TORCH, Cell, agent_config, finish, run_launcher, torchrun, webhook

pytestmark = REAL_TORCH

WORLD = 2
FORMS = {
    "plain": (),
    "tee": ("--tee", "3"),
    "redirects": ("--redirects", "3", "--log-dir", "{tmp}/torchrun-logs"),
}


def _records(tmp: Path, run: str) -> list[str]:
    """The failure records the agents left in the run's shared folder."""
    return sorted(p.name for p in (tmp / "dumps" / run / ".ranks").glob("failed-*"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("form", "fault"), [("plain", "nan"), ("redirects", "nan"), ("tee", "loader_hang")])
def test_a_torchrun_job_is_the_run_its_rdzv_id_names(tmp_path: Path, form: str, fault: str) -> None:
    """`run -- torchrun --rdzv-id job17 ...` with no run name of the user's: the findings (the
    run pipeline's NaN of a plain torchrun's combined log, the workers' own), the alerts and
    the stall's incident folder are run job17's, with the world size of the workers."""
    run = f"job17-{tmp_path.name[-12:]}"
    env = {"FAULT": fault, "FAULT_RANK": "1", "FAULT_STEP": "8", "STEPS": "20" if fault == "nan" else "60"}
    more = [a.format(tmp=tmp_path) for a in FORMS[form]]
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", run]
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url, named=False)
        running = run_launcher(tmp_path, cfg, torchrun(WORLD, *rdzv, *more), env)

        def stalled(rows: list[dict[str, object]]) -> bool:
            return {f["rank"] for f in rows if f["kind"] == "stall" and not f.get("resolved")} >= {0, 1}

        c = finish(running, tmp_path, posted, hang=stalled if fault == "loader_hang" else None)
    assert c.findings and {f["run"] for f in c.findings} == {run}, c.debug()
    assert c.firing() and {a["run"] for a in c.alerts} == {run}, c.debug()
    if fault == "nan":
        assert c.rc == 0 and c.of("nan_loss"), c.debug()
    else:
        [alert] = c.alerts_of("stall")
        incident = Path(alert["diagnosis"]["incident"])
        assert incident.parent == tmp_path / "dumps" / run, c.debug()
        assert (incident / "rank-1.txt").exists() and (incident / "rank-0.txt").exists(), c.debug()
        assert alert["diagnosis"]["world_size"] == WORLD, alert
    assert not (tmp_path / "dumps" / "default").exists(), sorted(
        p.name for p in (tmp_path / "dumps").iterdir()
    )


def _job(tmp: Path, cfg: Path, env: dict[str, str], posted: list[str], name: str) -> Cell:
    """One `run -- torchrun --tee 3` job in ``tmp``'s run folder, its own findings file and logs."""
    work = tmp / name
    work.mkdir()
    running = run_launcher(work, cfg, torchrun(WORLD, "--tee", "3"), env)
    return finish(running, work, posted)


@pytest.mark.timeout(300)
def test_a_healthy_job_leaves_no_failure_and_the_next_job_is_judged_on_its_own(tmp_path: Path) -> None:
    """Two `run -- torchrun --tee 3` jobs one after the other in the same run folder, under
    the same run name (``run.name``, or a reused ``--rdzv-id``). The first ends well: both ranks
    exit 0 together and torchrun exits 0, and no ``failed-*`` record is left. In the second,
    rank 1 raises at step 6 (after step 5's line): rank 0's gloo error names rank 1's failure
    of this job, never a clean exit of the first job, and the second job's records are its own
    failures only."""
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        run = next(
            line.split(": ")[-1].rstrip("}") for line in cfg.read_text().splitlines() if "name:" in line
        )
        healthy = _job(tmp_path, cfg, {"FAULT": "none", "STEPS": "30"}, posted, "job1")
        # (Not asserted silent: on a loaded node a healthy job's last seconds can outlast the
        # stall floor; test_launch_matrix's healthy cells are about that.)
        assert healthy.rc == 0 and not healthy.of("crash"), healthy.debug()
        assert _records(tmp_path, run) == [], _records(tmp_path, run)
        crash = _job(
            tmp_path,
            cfg,
            {"FAULT": "raise", "FAULT_RANK": "1", "FAULT_STEP": "6", "STEPS": "30"},
            posted,
            "job2",
        )
    assert crash.rc == 1, crash.debug()
    [own] = crash.on(1, "crash")
    assert own["step"] == 5 and "exited with code 1" in own["message"], crash.debug()
    blamed = crash.on(0, "crash", "peer_error")
    assert blamed, crash.debug()
    for f in blamed:
        assert f["message"].startswith(("rank 1 failed first", "the connection gloo lost")), crash.debug()
        assert "exited with status 0" not in f["message"], crash.debug()
        first = f["diagnosis"]["first_failure"]
        if first is not None:
            assert first["rank"] == 1 and first["kind"] != "exit", crash.debug()
    [alert] = crash.alerts_of("crash")
    assert alert["suspect"] == 1 and alert["summary"] == "crash on rank 1, suspect rank 1", alert
    records = [
        json.loads((tmp_path / "dumps" / run / ".ranks" / n).read_text()) for n in _records(tmp_path, run)
    ]
    assert [(r["rank"], r["kind"]) for r in records if not r["consequence"]] == [(1, "crash")], records


@pytest.mark.timeout(300)
def test_two_jobs_at_once_each_read_and_echo_only_their_own_lines(tmp_path: Path) -> None:
    """s36 e11/e18: two `run -- torchrun --tee 3` jobs at once from two folders, one config
    (one log folder): both agents appended to ``rank-0.log``, so each echoed the other's lines
    and judged them as its own (another job's NaN, or its Ctrl-C traceback, as this job's). Job
    A goes NaN from step 3 and runs on; job B, started once A steps, is healthy: B's echo, log
    and findings hold none of A's NaN lines, A's hold them, and each log file is one job's."""
    cfg = agent_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("echo: false", "echo: true"))
    work_a, work_b = tmp_path / "a", tmp_path / "b"
    work_a.mkdir()
    work_b.mkdir()
    nan = {"FAULT": "nan", "FAULT_RANK": "0", "FAULT_STEP": "3", "STEPS": "300"}
    job_a = run_launcher(work_a, cfg, torchrun(1, "--tee", "3"), nan)
    try:
        echo_a = work_a / "agent.out"
        wait_for(lambda: "loss=nan" in echo_a.read_text(errors="replace"), 120, "A's NaN", 0.2)
        job_b = run_launcher(work_b, cfg, torchrun(1, "--tee", "3"), {"FAULT": "none", "STEPS": "20"})
        b = finish(job_b, work_b, [])
    finally:
        a = finish(job_a, work_a, [])
    assert a.rc == 0 and b.rc == 0, (a.debug(), b.debug())
    assert a.of("nan_loss") and not b.of("nan_loss"), (a.debug(), b.debug())
    assert "loss=nan" in a.out and "starting" in b.out, b.out
    assert "loss=nan" not in (work_b / "agent.out").read_text(errors="replace")
    logs = sorted((tmp_path / "logs").iterdir(), key=lambda p: len(p.name))
    assert logs[0].name == "rank-0.log" and re.fullmatch(r"rank-0\.\d+\.log", logs[1].name), logs
    texts = [p.read_text(errors="replace") for p in logs]
    assert [t.count(" starting") for t in texts] == [1, 1], texts
    assert sorted("loss=nan" in t for t in texts) == [False, True]
