"""Real DDP jobs (CPU torch, gloo, 4 ranks), one ``rankwatch run`` agent per rank: the agents
must name the rank that broke the job, as a user would see it.

The workload (tests/workloads/ddp_train.py) is a tiny causal block with a registered buffer
(so DDP broadcasts buffers before each forward) fed by a DataLoader with one worker process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import free_port
from torchjobs import REAL_TORCH, WORKLOAD, agent_config, job_env, job_processes

# find_spec, not importorskip: collecting this module (as `-m unit` does) must not import torch
pytestmark = REAL_TORCH

WORLD = 4
SUSPECT_2 = "suspect: rank 2 (the only rank not waiting in a collective"
START_S = 120.0  # 4 ranks + 4 agents import torch on 2 busy cores


def config(tmp: Path, extra: str = "", floor: str = "4s") -> Path:
    return agent_config(tmp, floor=floor, extra=extra)


class Job:
    """One agent per rank, each launching its rank of the workload."""

    def __init__(
        self, tmp: Path, env: dict[str, str], cfg_extra: str = "", world: int = WORLD, floor: str = "4s"
    ) -> None:
        self.tmp = tmp
        self.world = world
        self.tag = uuid.uuid4().hex
        self.cfg = config(tmp, cfg_extra, floor)
        port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = time.monotonic()
        for r in range(world):
            penv = job_env(self.tag, {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), **env})
            penv.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(self.cfg)]
            cmd += ["--findings-jsonl", str(tmp / f"f{r}.jsonl"), "--", sys.executable, str(WORKLOAD)]
            out = open(tmp / f"agent-{r}.out", "wb")  # noqa: SIM115 - closed with the process
            self.procs.append(subprocess.Popen(cmd, env=penv, stdout=out, stderr=subprocess.STDOUT))
            out.close()

    def findings(self, rank: int) -> list[dict[str, Any]]:
        path = self.tmp / f"f{rank}.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    def on_every_rank(self, kind: str) -> list[dict[str, Any]] | None:
        found = [self.first(r, kind) for r in range(self.world)]
        return found if all(found) else None  # type: ignore[return-value]

    def first(self, rank: int, kind: str) -> dict[str, Any] | None:
        return next((f for f in self.findings(rank) if f["kind"] == kind and not f.get("resolved")), None)

    def wait(self, what: str, check: Callable[[], Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            time.sleep(0.25)
        raise AssertionError(f"timed out waiting for {what}\n{self.debug()}")

    def steps(self, rank: int) -> int:
        log = self.tmp / "logs" / f"rank-{rank}.log"
        try:
            return log.read_text(errors="replace").count("step=")
        except OSError:
            return 0

    def debug(self) -> str:
        out = []
        for r in range(self.world):
            out.append(f"--- rank {r}: {[f['kind'] for f in self.findings(r)]}")
            with_text = self.tmp / f"agent-{r}.out"
            if with_text.exists():
                out.append(with_text.read_text(errors="replace")[-1500:])
        return "\n".join(out)

    def job_processes(self) -> list[psutil.Process]:
        """Every live process started for this job (they all carry its tag in their environment)."""
        return job_processes(self.tag)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def kill_all(self) -> None:
        for p in self.job_processes():
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.fixture
def job_factory(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    jobs: list[Job] = []

    def make(env: dict[str, str], cfg_extra: str = "", world: int = WORLD, floor: str = "4s") -> Job:
        job = Job(tmp_path, env, cfg_extra, world, floor)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.stop()
        job.kill_all()


def dumps_diff(tmp: Path, incident: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "dumps", "diff", incident, "--dir", str(tmp / "dumps")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def latency(tmp: Path, name: str, seconds: float) -> None:
    """bench/bench_ddp.py reads these."""
    target = os.environ.get("RANKWATCH_DDP_LATENCY")
    if target:
        with open(target, "a") as fh:
            fh.write(json.dumps({"scenario": name, "latency_s": round(seconds, 2)}) + "\n")


def test_dataloader_deadlock_names_rank_2(job_factory: Callable[..., Job], tmp_path: Path) -> None:
    job = job_factory({"FAULT": "loader_hang", "FAULT_RANK": "2", "FAULT_STEP": "15"})
    job.wait("rank 2 to reach its fault", lambda: job.steps(2) >= 14, START_S)
    hung_at = time.monotonic()
    stalls = job.wait("a stall finding on every rank", lambda: job.on_every_rank("stall"), 60)
    latency(tmp_path, "dataloader_deadlock", time.monotonic() - hung_at)
    for r, f in enumerate(stalls):
        assert f["rank"] == r
        assert f"{SUSPECT_2}: in data loading" in f["message"], f
        assert f["diagnosis"]["suspects"] == [2], f
    assert "This rank is in data loading" in stalls[2]["message"]
    assert "read_shard_forever" in stalls[2]["message"]  # its worker's place
    assert "This rank only waits in" in stalls[1]["message"] and "fix rank 2" in stalls[1]["message"]
    # Inside backward the Python stack is ambiguous: a second, native look shows c10d's reducer.
    for r in (1, 3):
        assert stalls[r]["evidence"]["activity"]["certain"] is True, stalls[r]["evidence"]
        assert "(native: c10d)" in stalls[r]["message"]
    incident = Path(stalls[0]["diagnosis"]["incident"])
    assert all(stall["diagnosis"]["incident"] == str(incident) for stall in stalls)
    text = dumps_diff(tmp_path, incident.name)
    assert f"{SUSPECT_2}: in data loading" in text, text
    assert "ranks 0,1,3 wait for it" in text and "DDP gradient all-reduce inside loss.backward()" in text
    # The stop ends every process of the job, rank 2's hung DataLoader worker included.
    workers = [p for p in job.job_processes() if p.pid not in {q.pid for q in job.procs}]
    assert len(workers) >= 8  # 4 ranks and their workers
    job.stop()
    job.wait("no process of the job left", lambda: not job.job_processes(), 10)


def test_extra_barrier_is_a_collective_mismatch(job_factory: Callable[..., Job], tmp_path: Path) -> None:
    job = job_factory({"FAULT": "barrier", "FAULT_RANK": "0", "FAULT_STEP": "15"})
    job.wait("rank 0 to reach its fault", lambda: job.steps(0) >= 14, START_S)
    hung_at = time.monotonic()
    stalls = job.wait("a stall finding on every rank", lambda: job.on_every_rank("stall"), 60)
    latency(tmp_path, "collective_mismatch", time.monotonic() - hung_at)
    for f in stalls:
        mismatch = "collective mismatch: rank 0 in barrier called from sync_metrics (ddp_train.py:"
        assert mismatch in f["message"], f
        assert "ranks 1-3 in broadcast (DDP buffer broadcast" in f["message"]
        assert "real error" not in f["message"]
        assert f["diagnosis"]["verdict"] == "collective_mismatch"
    text = dumps_diff(tmp_path, Path(stalls[0]["diagnosis"]["incident"]).name)
    assert "suspect: rank 0 (collective mismatch" in text and "real error" not in text


def test_sigkill_of_rank_3_is_named_by_every_peer(job_factory: Callable[..., Job], tmp_path: Path) -> None:
    job = job_factory({"FAULT": "sigkill", "FAULT_RANK": "3", "FAULT_STEP": "15"})
    job.wait("rank 3 to die", lambda: job.first(3, "crash"), START_S)
    died = time.monotonic()
    crash3 = job.first(3, "crash")
    assert crash3 is not None and "SIGKILL" in crash3["message"]

    def peers_named() -> list[dict[str, Any]] | None:
        out = []
        for r in range(3):
            f = job.first(r, "crash") or job.first(r, "stall")
            if f is None:
                return None
            out.append(f)
        return out

    peers = job.wait("a crash or stall finding on every peer", peers_named, 60)
    latency(tmp_path, "sigkill_first_failure", time.monotonic() - died)
    for f in peers:
        assert "rank 3 failed first" in f["message"].lower(), f
        assert "SIGKILL" in f["message"], f
        named = ((f.get("diagnosis") or {}).get("first_failure") or {}).get("rank") == 3
        assert named or "Rank 3 failed first" in f["message"], f


def test_oom_on_rank_1_is_named_by_every_peer(job_factory: Callable[..., Job], tmp_path: Path) -> None:
    job = job_factory({"FAULT": "oom", "FAULT_RANK": "1", "FAULT_STEP": "15"})
    job.wait("rank 1's OOM", lambda: job.first(1, "oom"), START_S)
    failed = time.monotonic()
    assert "failed first" not in job.first(1, "oom")["message"]

    def peers_named() -> list[dict[str, Any]] | None:
        found = [job.first(r, "crash") or job.first(r, "stall") for r in (0, 2, 3)]
        return found if all(found) else None  # type: ignore[return-value]

    peers = job.wait("a crash or stall finding on every peer", peers_named, 60)
    latency(tmp_path, "oom_first_failure", time.monotonic() - failed)
    for f in peers:
        assert "rank 1 failed first" in f["message"].lower(), f
        assert "out of memory" in f["message"].lower(), f


def test_a_rank_that_leaves_early_is_named_by_every_peer(
    job_factory: Callable[..., Job], tmp_path: Path
) -> None:
    """One agent per rank: rank 2 returns from main with status 0 at step 15 while the others
    enter the next collective. Rank 2's agent (its parent: status 0 known) records it; every
    peer's gloo `Connection closed by peer` (or hang) names rank 2, and none is blamed itself."""
    job = job_factory({"FAULT": "exit", "FAULT_RANK": "2", "FAULT_STEP": "15"})

    def peers_named() -> list[dict[str, Any]] | None:
        found = [
            job.first(r, "crash") or job.first(r, "peer_error") or job.first(r, "stall") for r in (0, 1, 3)
        ]
        return found if all(found) else None  # type: ignore[return-value]

    peers = job.wait("a crash, peer error or stall finding on every peer", peers_named, START_S)
    for f in peers:
        assert "rank 2 failed first: exited with status 0 at step 14" in f["message"], f
        assert f["diagnosis"]["suspect"] == 2, f
    assert not job.first(2, "crash"), job.first(2, "crash")


def test_a_rank_hung_inside_torch_save_stalls_without_a_false_corrupt(
    job_factory: Callable[..., Job], tmp_path: Path
) -> None:
    """Rank 0 hangs inside torch.save (its writes stop after the first bytes, as on a hung NFS
    server) with the checkpoint folder watched: the open save is not progress (every rank
    stalls within seconds, not after the 600 s allowance) and the file its writer still holds
    open is not called corrupt (corrupt_after shortened to 3 s to show it)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    extra = f"checkpoints: {{dir: {ckpt}, settle: 1s, corrupt_after: 3s, poll_interval: 500ms}}\n"
    job = job_factory(
        {"FAULT": "save_hang", "FAULT_RANK": "0", "FAULT_STEP": "15", "CKPT_DIR": str(ckpt)}, extra
    )
    job.wait("rank 0's save to begin", lambda: list(ckpt.glob("ckpt_step15.pt")), START_S)
    began = time.monotonic()
    stalls = job.wait("a stall finding on every rank", lambda: job.on_every_rank("stall"), 60)
    took = time.monotonic() - began
    latency(tmp_path, "torch_save_hang", took)
    assert took < 45, took  # one base timeout after the last write (floor 4 s), not 600 s more
    assert stalls[0]["diagnosis"]["suspects"] == [0], stalls[0]
    time.sleep(5.0)  # past corrupt_after: the file is still open in its writer
    for r in range(WORLD):
        assert not job.first(r, "checkpoint_corrupt"), job.first(r, "checkpoint_corrupt")


def test_straggler_is_named_on_rank_1_only(job_factory: Callable[..., Job], tmp_path: Path) -> None:
    extra = "detectors: {warmup_steps: 5, throughput: {baseline_steps: 10, consecutive: 4}}\n"
    job = job_factory({"FAULT": "slow", "FAULT_RANK": "1", "FAULT_STEP": "40", "SLOW_FACTOR": "4"}, extra)
    job.wait("rank 1 to slow down", lambda: job.steps(1) >= 40, START_S)
    slowed = time.monotonic()
    found = job.wait("a straggler finding", lambda: job.first(1, "straggler"), 90)
    latency(tmp_path, "straggler", time.monotonic() - slowed)
    assert "rank 1 is the straggler" in found["message"]
    drops = job.wait("throughput_drop on every rank", lambda: job.on_every_rank("throughput_drop"), 30)
    for r in (0, 2, 3):
        assert job.first(r, "straggler") is None, r
        assert "Rank 1 is the straggler" in drops[r]["message"], drops[r]
        assert "GPU clocks" not in drops[r]["message"], drops[r]


def test_torchrun_workers_are_ranks_of_their_own(tmp_path: Path) -> None:
    """``rankwatch run -- torchrun --nproc-per-node 4 --tee 3 ...``: one agent, four ranks."""
    tag = uuid.uuid4().hex
    cfg = config(tmp_path)
    env = job_env(tag, {"FAULT": "loader_hang", "FAULT_RANK": "2", "FAULT_STEP": "15"})
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    cmd = [
        sys.executable,
        "-m",
        "rankwatch",
        "run",
        "--config",
        str(cfg),
        "--findings-jsonl",
        str(tmp_path / "f.jsonl"),
    ]
    cmd += ["--", *torchrun, "--tee", "3", str(WORKLOAD)]
    out = open(tmp_path / "agent.out", "wb")  # noqa: SIM115 - closed below
    agent = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    job = Job.__new__(Job)  # only its helpers: findings come from one file here
    job.tmp, job.world, job.tag, job.procs = tmp_path, WORLD, tag, [agent]

    def found(kind: str) -> list[dict[str, Any]]:
        path = tmp_path / "f.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        return [f for f in rows if f["kind"] == kind and not f.get("resolved")]

    try:
        log = tmp_path / "logs" / "rank-0.log"
        job.wait(
            "rank 2 to reach its fault",
            lambda: log.exists() and "[default2]:step=14 " in log.read_text(),  # torchrun's --tee 3 prefix
            START_S,
        )
        hung_at = time.monotonic()
        stalls = job.wait(
            "a stall on every rank",
            lambda: len({f["rank"] for f in found("stall")}) == WORLD and found("stall"),
            60,
        )
        latency(tmp_path, "torchrun_dataloader_deadlock", time.monotonic() - hung_at)
        assert sorted(f["rank"] for f in stalls) == [0, 1, 2, 3], stalls  # no stall for rank None
        for f in stalls:
            assert f"{SUSPECT_2}: in data loading" in f["message"], f
        incident = Path(stalls[0]["diagnosis"]["incident"])
        assert sorted(p.name for p in incident.glob("rank-*.txt")) == [f"rank-{r}.txt" for r in range(WORLD)]
        assert f"{SUSPECT_2}: in data loading" in dumps_diff(tmp_path, incident.name)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
    # The stop was asked for: no crash, on any rank or the launcher.
    assert not found("crash"), found("crash")
    job.wait("no process of the job left", lambda: not job.job_processes(), 10)


def test_healthy_run_stays_silent(job_factory: Callable[..., Job], tmp_path: Path) -> None:
    """Four healthy ranks to the end: no finding of severity warning or above on any rank. (The
    stall floor is 20 s here: after its last step a rank's teardown — destroy_process_group, the
    DataLoader worker's join — takes more than the 4 s the hang tests use, on 2 busy cores.)"""
    job = job_factory({"FAULT": "none", "STEPS": "150"}, floor="20s")
    for p in job.procs:
        assert p.wait(timeout=110) == 0
    loud = [f for r in range(WORLD) for f in job.findings(r) if f["severity"] in ("warning", "critical")]
    assert not loud, loud
    assert all(job.steps(r) >= 150 for r in range(WORLD))
