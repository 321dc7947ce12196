"""``rankwatch run -- torchrun``: each worker's identity is its own (runtime/workers.py), read
from the environment torchrun gave it, and the run's own pipeline and the agent's captures
take the workers' run; a run name the user chose wins (issue 28: identity belongs to the
watched process, the agent's own is only the default for what it launched). The real jobs
are tests/test_launch_matrix.py's."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from rankwatch.config.loader import load_config
from rankwatch.identity import identity_from_env
from rankwatch.runtime import workers
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.services import Services

pytestmark = pytest.mark.unit

TORCHRUN_ENV = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "job17"}


def _launched(tmp: Path, env: dict[str, str], config: str = "") -> tuple[Agent, Any, Any]:
    """An agent as `run -- torchrun` makes it (its own environment names no run), the run's
    pipeline, and the worker found under the launcher with ``env``."""
    cfg_path = tmp / "rw.yaml"
    cfg_path.write_text(f"dumps: {{dir: {tmp / 'dumps'}}}\n{config}")
    cfg = load_config(str(cfg_path))
    agent = Agent(cfg, identity_from_env(cfg.run, {}))
    agent.launched = True
    log = tmp / "combined.log"
    log.write_text("")
    run = workers.run_watcher(cfg, agent.identity, log, emit=agent.emit, clock=agent.clock)
    agent.adopt(run)

    async def add() -> Any:
        fleet = workers.Fleet(agent, cfg, log, os.getpid(), [], cmd=["torchrun"], run_pipeline=run)
        fleet._add(os.getpid(), env)
        for t in fleet.tasks:
            t.cancel()
        await asyncio.gather(*fleet.tasks, return_exceptions=True)
        return fleet.by_rank[1]

    return agent, run, asyncio.run(add())


def test_a_torchrun_workers_run_id_is_its_pipelines_run(tmp_path: Path) -> None:
    """`--rdzv-id job17`: the worker's findings, alert keys, records and incident folder are
    run job17's, with the world size its environment says; so are the run pipeline's (the
    NaN of a plain torchrun's combined log), and a SIGUSR1 capture goes to dumps/job17."""
    agent, run, worker = _launched(tmp_path, TORCHRUN_ENV)
    assert agent.identity.run == "default"
    assert (worker.identity.run, worker.identity.rank, worker.identity.world_size) == ("job17", 1, 2)
    assert worker.identity.local_rank == 1
    assert run.identity.run == "job17" and run.identity.rank is None
    assert agent.job_run() == "job17"
    assert Services(agent, agent.cfg).own_pipeline() is run  # what the agent samples stays the run's


@pytest.mark.parametrize(
    ("config", "env", "expected"),
    [
        ("run: {name: mine}\n", {}, "mine"),  # config or --set run.name
        ("", {"RANKWATCH_RUN": "chosen"}, "chosen"),  # the user's environment, inherited by the job
        ("", {"SLURM_JOB_ID": "4242"}, "4242"),  # torchrun inside a Slurm job: the job id, as the agent's
        ("", {"TORCHELASTIC_RUN_ID": "none"}, "default"),  # torchrun's static rendezvous: no id at all
    ],
)
def test_a_run_name_the_user_chose_wins_over_torchruns(
    tmp_path: Path, config: str, env: dict[str, str], expected: str
) -> None:
    _, run, worker = _launched(tmp_path, {**TORCHRUN_ENV, **env}, config)
    assert worker.identity.run == expected
    assert run.identity.run == expected
