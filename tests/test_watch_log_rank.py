"""``watch --log PATH`` with one file: the rank is the one its name says, as with several files
and in ``analyze`` (sources/logfiles.py), unless ``run.rank`` says otherwise (black-box s37 f23:
a single ``--log rank-1.log`` gave findings and alerts with rank null)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import wait_for
from faultlib import webhook
from rankwatch.config.schema import RunConfig
from rankwatch.identity import Identity
from rankwatch.sources.logfiles import log_identity

AGENT = Identity(run="r", rank=None, local_rank=None, world_size=None, node="n")


@pytest.mark.unit
def test_one_log_named_for_a_rank_is_that_rank() -> None:
    assert log_identity(AGENT, RunConfig(), [Path("/logs/rank-1.log")]).rank == 1
    assert log_identity(AGENT, RunConfig(), ["worker_3.out"]).rank == 3


@pytest.mark.unit
def test_one_torchrun_worker_file_is_its_folders_local_rank() -> None:
    ident = log_identity(AGENT, RunConfig(), ["tl/job_x/attempt_0/2/stdout.log"])
    assert (ident.rank, ident.local_rank) == (2, 2)


@pytest.mark.unit
def test_the_name_wins_over_the_agents_environment_and_config_wins_over_the_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An ``srun --overlap`` step beside the job has a task id of its own (SLURM_PROCID 0): the
    file the user named says more. ``run.rank`` is the user's own word and wins."""
    from_env = Identity(run="r", rank=0, local_rank=0, world_size=2, node="n")
    caplog.set_level("WARNING", logger="rankwatch.logs")
    ident = log_identity(from_env, RunConfig(), ["rank-1.log"])
    assert (ident.rank, ident.local_rank, ident.world_size) == (1, 0, 2)
    assert "rank 1 by its name, the agent's environment says rank 0" in caplog.text
    configured = Identity(run="r", rank=3, local_rank=None, world_size=None, node="n")
    assert log_identity(configured, RunConfig(rank=3), ["rank-1.log"]).rank == 3


@pytest.mark.unit
def test_a_name_without_a_rank_keeps_the_agents_rank() -> None:
    from_env = Identity(run="r", rank=5, local_rank=None, world_size=None, node="n")
    assert log_identity(from_env, RunConfig(), ["train.log"]).rank == 5
    assert log_identity(AGENT, RunConfig(), ["train.log"]).rank is None


@pytest.mark.process
def test_watch_one_log_named_rank_1_reports_rank_1(tmp_path: Path) -> None:
    """f23: ``watch --log rank-1.log`` (no RANK in the agent's environment): the NaN finding
    and its alert are rank 1's (one rank's alert names no suspect: that takes two ranks)."""
    log = tmp_path / "rank-1.log"
    log.write_text("".join(f"step={s} loss={1.0 / s:.5f} lr=0.01\n" for s in range(1, 6)))
    found = tmp_path / "f.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID", "LOCAL_RANK")}
    lines: list[str] = []
    with webhook() as (url, posted):
        cfg = tmp_path / "rw.yaml"
        cfg.write_text(
            f"alerts: {{startup_quiet: 0s, group_wait: 0s, webhook: {{urls: ['{url}']}}}}\n"
            "detectors: {warmup_steps: 2}\n"
        )
        agent = subprocess.Popen(
            [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg), "--no-server",
             "--log", str(log), "--findings-jsonl", str(found)],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        reader = threading.Thread(target=lambda: lines.extend(agent.stderr or ()), daemon=True)
        reader.start()
        try:
            # New lines must come after the replay of the file's history, as a rank's next do.
            wait_for(lambda: any("replayed the last" in ln for ln in lines), 30, "the replay")
            assert any(ln.startswith("rankwatch INFO") and "rank 1: replayed" in ln for ln in lines), lines
            with open(log, "a") as fh:
                for s in range(6, 13):
                    fh.write(f"step={s} loss={'nan' if s >= 10 else f'{1.0 / s:.5f}'} lr=0.01\n")
            nans = wait_for(
                lambda: [f for f in _findings(found) if f["kind"] == "nan_loss"], 30, "the NaN finding"
            )
            assert [(f["rank"], f["step"]) for f in nans] == [(1, 10)], nans
            bodies = wait_for(
                lambda: [json.loads(b) for b in posted], 30, "the alert: " + "".join(lines)[-3000:]
            )
            assert (bodies[0]["kind"], bodies[0]["rank"]) == ("nan_loss", 1), bodies[0]
            assert [m["rank"] for m in bodies[0]["members"]] == [1], bodies[0]
        finally:
            agent.terminate()
            agent.wait(20)
            reader.join(10)


def _findings(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
