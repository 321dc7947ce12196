"""Identity belongs to the watched process: read from its own environment and cgroup."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rankwatch.config.schema import RunConfig
from rankwatch.identity import Identity, identity_of_process, launcher_run_id, pod_of

pytestmark = pytest.mark.unit

AGENT = Identity("default", 0, 0, None, "node-7")
# As each launcher exports them (Slurm srun; torchrun/elastic, which accelerate and the DeepSpeed
# launcher use too; Open MPI).
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}
TORCHRUN = {"TORCHELASTIC_RUN_ID": "job-a", "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4"}
OMPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "16"}
# /proc/<pid>/cgroup of a container of a Kubernetes pod (cgroup v2, systemd driver).
K8S_CGROUP = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-"
    "pod1a2b3c4d_5e6f_7a8b_9c0d_112233445566.slice/cri-containerd-0123abcd.scope\n"
)


@pytest.mark.parametrize(
    ("env", "cgroup", "want"),
    [
        (SLURM, None, ("4242", 5, 1, 8)),
        (TORCHRUN, None, ("job-a", 3, 3, 4)),
        (OMPI, None, ("default", 2, 0, 16)),
        ({"RANK": "1", "WORLD_SIZE": "2"}, K8S_CGROUP, ("pod-1a2b3c4d-5e6f-7a8b-9c0d-112233445566", 1, 0, 2)),
    ],
)
def test_a_process_identity_is_its_own(env: dict[str, str], cgroup: str | None, want: tuple) -> None:
    # The agent's own config names a rank: it is the agent's, not the watched process's.
    ident = identity_of_process(RunConfig(rank=7), env, AGENT, user="alice", cgroup=cgroup)
    assert (ident.run, ident.rank, ident.local_rank, ident.world_size) == want
    assert ident.user == "alice" and ident.node == "node-7"


def test_pod_uid_from_cgroup_v1() -> None:
    v1 = "11:memory:/kubepods/besteffort/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/abcdef\n"
    assert pod_of(v1) == "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b" and pod_of("0::/user.slice") is None


def test_one_list_of_rank_variables() -> None:
    """workers.py and modes.py read the same lists as identity.py (three copies had drifted)."""
    import rankwatch.identity as identity
    from rankwatch.runtime import modes, workers

    assert workers.RANK_VARS is identity.RANK_VARS and modes.RANK_VARS is identity.RANK_VARS
    assert workers.LOCAL_RANK_VARS is identity.LOCAL_RANK_VARS and workers.WORLD_VARS is identity.WORLD_VARS


def test_two_jobs_rank_0_nan_at_once_are_two_alerts(tmp_path: Path) -> None:
    """A node daemon sees rank 0 of job A and rank 0 of job B go NaN at once: two alerts, each
    with its own run, not one deduplicated on the agent's (run, rank, kind)."""
    from rankwatch.actions.alerts.dispatcher import AlertDispatcher
    from rankwatch.config.schema import AlertsConfig
    from rankwatch.records import Finding, Severity
    from test_alerts import RecordingSink, running, settle

    async def go() -> list:
        sink = RecordingSink()
        cfg = AlertsConfig(startup_quiet=0.0, group_wait=0.0, spool_dir=str(tmp_path / "spool"))
        d = AlertDispatcher(cfg, AGENT, sinks=[sink])
        async with running(d):
            for run in ("job-a", "job-b"):
                d.send(Finding("nan_loss", Severity.CRITICAL, 0, "loss is NaN at step 40", step=40, run=run))
            await settle(d)
            from conftest import until

            await until(lambda: len(sink.alerts) == 2)
        return sink.alerts

    alerts = asyncio.run(go())
    assert sorted(a.run for a in alerts) == ["job-a", "job-b"]
    assert all(a.ranks == [0] for a in alerts)


def test_every_finding_carries_its_processs_world_size(tmp_path: Path) -> None:
    """``watch --pid`` and the node daemon: the agent's own identity knows no world, each watched
    worker's environment says WORLD_SIZE=2. Its pipeline's findings carry 2, and so do the
    findings stream's lines (the alert takes it from there: tests/test_alerts_policy.py)."""
    import json

    from rankwatch.actions.console import JsonlSink
    from rankwatch.config.schema import Config
    from rankwatch.runtime.watcher import RankWatcher

    env = {"TORCHELASTIC_RUN_ID": "89663ef6", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    ident = identity_of_process(RunConfig(), env, AGENT)
    log = tmp_path / "stdout.log"
    log.write_text("step=19 loss=2.1 lr=0.01 rank=1\nstep=20 loss=nan lr=0.01 rank=1\n")
    found: list = []
    w = RankWatcher(Config(), ident, [log], emit=found.append)
    w.feed_lines(w.streams[0], w.streams[0].follower.read_available())
    (nan,) = [f for f in found if f.kind == "nan_loss"]
    assert (nan.run, nan.rank, nan.world_size) == ("89663ef6", 1, 2)
    sink = JsonlSink(tmp_path / "f.jsonl", AGENT)
    sink.send(nan)
    doc = json.loads((tmp_path / "f.jsonl").read_text())
    assert (doc["run"], doc["rank"], doc["world_size"]) == ("89663ef6", 1, 2)


@pytest.mark.parametrize(
    ("cmd", "env", "run"),
    [
        (["torchrun", "--nnodes", "2", "--rdzv-id", "j1", "train.py", "--rdzv-id", "x"], {}, "j1"),
        (["/v/bin/torchrun", "--rdzv_id=j2", "train.py"], {}, "j2"),
        (["python", "-m", "torch.distributed.run", "--rdzv-id", "j3", "train.py"], {}, "j3"),
        (["torchrun", "train.py"], {"PET_RDZV_ID": "j4"}, "j4"),  # torch's argparse_util.env
        (["torchrun", "--rdzv-id", "none", "train.py"], {}, None),  # torchrun's default
        (["torchrun", "--standalone", "--rdzv-id", "j5", "train.py"], {}, None),  # a random id
        (["torchrun", "train.py", "--rdzv-id", "j6"], {}, None),  # the script's own argument
        (["python", "train.py", "--rdzv-id", "j7"], {}, None),  # no launcher
    ],
)
def test_the_run_id_torchrun_will_give_its_workers_is_read_from_its_command(
    cmd: list[str], env: dict[str, str], run: str | None
) -> None:
    assert launcher_run_id(cmd, env) == run


def test_run_mode_takes_the_jobs_run_id_and_its_own_user_from_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rankwatch run -- torchrun --rdzv-id J ...` with no run name: the agent's identity is run
    J before any worker starts (a multi-node job's agents share its alert board), and what it
    runs runs as its own user: every finding says whose (README: `user` in the findings)."""
    import argparse
    import pwd

    from rankwatch import cli
    from rankwatch.identity import RUN_VARS

    for k in (*RUN_VARS, "PET_RDZV_ID"):
        monkeypatch.delenv(k, raising=False)
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(f"dumps: {{dir: {tmp_path / 'd'}}}\nserver: {{enabled: false}}\n")
    args = argparse.Namespace(
        config=str(cfg), findings_jsonl=None, no_server=True, listen=None, dumps_dir=None
    )
    cmd = ["torchrun", "--nnodes", "2", "--rdzv-id", "job7", "train.py"]
    _, ident, _ = cli._live_setup(args, cmd)
    assert ident.run == "job7"
    assert ident.user == pwd.getpwuid(os.geteuid()).pw_name
    _, plain, _ = cli._live_setup(args)  # watch: the user is each watched process's own
    assert plain.run == "default" and plain.user is None
