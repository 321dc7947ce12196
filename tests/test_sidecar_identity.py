"""The sidecar form, one agent per rank: ``watch --match P --log L`` started with nothing of the
job in its own environment. The job's identity the log does not hold (its world size, its user)
is the watched process's, as ``watch --pid`` and the node daemon read it.
"""

from __future__ import annotations

import getpass
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import free_port, wait_for
from torchjobs import (
    REAL_TORCH,
    RUN_S,
    WORKLOAD,
    agent_config,
    job_env,
    rankwatch,
    read_jsonl,
    reap_leftovers,
    webhook,
)

pytestmark = REAL_TORCH

WORLD = 2


@pytest.mark.timeout(300)
def test_sidecar_per_rank_carries_the_watched_processes_world_size_and_user(tmp_path: Path) -> None:
    """s38 g15: two gloo ranks (WORLD_SIZE=2 in their environment), rank 1's loss NaN from step
    15, each rank's output in rank-N.log and one ``watch --match <its command> --log rank-N.log``
    per rank. The NaN findings and their alerts carry world size 2 and the ranks' user."""
    tag = uuid.uuid4().hex
    port = str(free_port())
    me = getpass.getuser()
    agents: list[subprocess.Popen[bytes]] = []
    ranks: list[subprocess.Popen[bytes]] = []
    found = [tmp_path / f"f{r}.jsonl" for r in range(WORLD)]
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url)
        try:
            for r in range(WORLD):
                cmd = rankwatch("watch", "--config", str(cfg), "--match", f"{tag}-r{r}")
                cmd += ["--log", str(tmp_path / f"rank-{r}.log"), "--findings-jsonl", str(found[r])]
                with open(tmp_path / f"agent-{r}.out", "ab") as out:
                    agents.append(
                        subprocess.Popen(cmd, env=job_env(tag, {}), stdout=out, stderr=subprocess.STDOUT)
                    )
            for r in range(WORLD):
                rank = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(WORLD)}
                fault = {"FAULT": "nan", "FAULT_RANK": "1", "FAULT_STEP": "15", "STEPS": "30"}
                env = job_env(tag, {**rank, **fault, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
                with open(tmp_path / f"rank-{r}.log", "ab") as out:
                    ranks.append(
                        subprocess.Popen(
                            [sys.executable, str(WORKLOAD), f"{tag}-r{r}"],
                            env=env,
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                        )
                    )
            for p in ranks:
                p.wait(timeout=RUN_S)
            wait_for(
                lambda: any(f["kind"] == "nan_loss" for f in read_jsonl(found)), 60, "the nan_loss finding"
            )
            wait_for(
                lambda: any(json.loads(b)["kind"] == "nan_loss" for b in posted), 60, "the nan_loss alert"
            )
        finally:
            for a in agents:
                if a.poll() is None:
                    a.send_signal(signal.SIGTERM)
            for a in agents:
                try:
                    a.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    a.kill()
                    a.wait(timeout=10)
            for p in ranks:
                if p.poll() is None:
                    p.kill()
            reap_leftovers(tag)
    rows = read_jsonl(found)
    alerts = [json.loads(b) for b in posted]
    debug = f"{[(f['kind'], f['rank'], f['world_size'], f['user']) for f in rows]}\n{alerts}"
    nan = [f for f in rows if f["kind"] == "nan_loss"]
    # DDP's all-reduce carries the NaN to rank 0 a step later: each sidecar tells its own rank's.
    assert (1, 15) in [(f["rank"], f["step"]) for f in nan], debug
    assert all((f["world_size"], f["user"]) == (WORLD, me) for f in nan), debug
    firing = [a for a in alerts if a["status"] == "firing" and a["kind"] == "nan_loss"]
    assert firing and all(a["world_size"] == WORLD and a["user"] == me for a in firing), debug
