"""The stall alert links the stacks the agent took, whatever the agent's shape: the capture's
outcome reaches the alert dispatcher as data (``DumpOutcome``), never as a sentence to parse."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import conftest
from rankwatch.actions.alerts import AlertDispatcher, AlertMessage
from rankwatch.actions.dump_outcome import DumpOutcome, dump_link
from rankwatch.config.schema import AlertsConfig, Config
from rankwatch.config.snapshot import replaced
from rankwatch.dumps.capture import DumpResult
from rankwatch.identity import Identity
from rankwatch.records import MAX_RANKS, MAX_TEXT, Diagnosis, Finding, Severity
from rankwatch.runtime.agent import Agent

pytestmark = pytest.mark.unit


@dataclass
class RecordingSink:
    name: str = "rec"
    alerts: list[AlertMessage] = field(default_factory=list)

    async def deliver(self, alert: AlertMessage) -> None:
        self.alerts.append(alert)


async def until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    await conftest.until(cond, timeout)


def _fake_capture(pid: int, **_: Any) -> DumpResult:
    thread = {"thread_id": 1, "thread_name": "MainThread", "pid": pid, "active": True, "frames": []}
    return DumpResult(pid, True, [thread], "Thread 1 (active): MainThread\n", None, 0.01, ["py-spy"])


def test_node_daemon_stall_alert_links_the_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One agent per node (identity rank None) watching ranks 0 and 1: it used to write "stack
    dumps for rank None: <folder>" into a note the dispatcher parsed back, filed the folder under
    rank None, and the stall alert of rank 1 went out with no link to its stacks."""
    monkeypatch.setattr("rankwatch.runtime.agent.capture", _fake_capture)
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    node = Identity(run="job", rank=None, local_rank=None, world_size=2, node="n")
    sink = RecordingSink()
    alerts = AlertsConfig(startup_quiet=0.0, group_wait=0.0, spool_dir=str(tmp_path / "spool"), board_dir="")

    async def go() -> Path | None:
        d = AlertDispatcher(alerts, node, sinks=[sink])
        agent = Agent(cfg, node, sinks=[d])
        for r in (0, 1):
            w = agent.add_watcher([tmp_path / f"rank-{r}.log"], Identity("job", r, r, 2, "n"))
            w.attach(os.getpid())
        task = asyncio.create_task(d.run())
        try:
            folder = await agent.capture_dumps("stall")  # as the cross-rank diagnosis does
            assert folder is not None
            stall = Finding("stall", Severity.CRITICAL, 1, "no progress for 61s on rank 1.", 9)
            stall.evidence = {"cross_rank": True}  # completed by it
            stall.diagnosed(incident=str(folder))
            agent.emit(stall)
            await until(lambda: len(sink.alerts) == 1)
        finally:
            await d.close(1.0)
            await asyncio.wait_for(task, 5.0)
        return folder

    folder = asyncio.run(go())
    [alert] = sink.alerts
    assert alert.ranks == [1] and alert.dump_path == str(folder)
    diagnosis = alert.members[0].diagnosis
    assert diagnosis is not None and diagnosis.dumps is not None and diagnosis.dumps.captured == (0, 1)


def test_outcome_text_is_composed_from_the_data() -> None:
    ok = DumpOutcome.of_capture("/d/inc", (0,), {1: "ptrace denied: Operation not permitted"}, "never shown")
    assert ok.text() == (
        "Stacks captured in /d/inc (`rankwatch dumps show`). Failed for rank 1: ptrace denied: Operation "
        "not permitted."
    )
    assert ok.to_json() == {
        "state": "captured",
        "folder": "/d/inc",
        "captured": [0],
        "failed": {"1": "ptrace denied: Operation not permitted"},
    }
    assert DumpOutcome.from_json(ok.to_json()) == ok
    failed = DumpOutcome.of_capture("/d/inc", (), {0: "py-spy not found: x"}, "Fix: install py-spy")
    assert (
        failed.text()
        == "Stack dumps failed, no stacks were captured: rank 0: py-spy not found: x. Fix: install py-spy"
    )
    f = Finding("stall", Severity.CRITICAL, 0, "m")
    f.diagnosed(dumps=failed)
    assert failed.link is None and dump_link(f) is None
    f.diagnosed(dumps=ok)
    assert dump_link(f) == "/d/inc"
    assert DumpOutcome("failed").text() == "No stacks were captured (no watched process to dump)."


def test_a_diagnosis_read_back_from_a_peers_file_is_bounded() -> None:
    """A board record, the spool or an incident's diagnosis.json may be another user's: what
    comes back is typed and bounded whatever it held."""
    doc = {
        "suspects": [1, "x", True, *range(100_000)],
        "verdict": "v" * 10_000,
        "incident": "/d/" + "i" * 100_000,
        "first_failure": {"rank": 3, "kind": ["odd"], "how": "h" * 10_000, "log": 5, "node": "n" * 1000},
        "dumps": {"state": "failed", "failed": {str(i): "w" * 10_000 for i in range(70_000)}, "problem": 1},
        "missing": list(range(100_000)),
    }
    d = Diagnosis.from_json(doc)
    assert d is not None and d.suspects[:2] == (1, 0) and len(d.suspects) <= MAX_RANKS
    assert len(d.missing) == MAX_RANKS and d.verdict is not None and len(d.verdict) == 64
    assert d.incident is not None and len(d.incident) == MAX_TEXT
    ff = d.first_failure
    assert ff is not None and ff.rank == 3 and ff.kind == "crash" and len(ff.how) == 300
    assert ff.log is None and ff.node is not None and len(ff.node) == 255
    assert d.dumps is not None and len(d.dumps.failed) == MAX_RANKS and d.dumps.problem is None
    assert all(len(w) == MAX_TEXT for w in d.dumps.failed.values())


def test_a_stall_of_job_a_never_dumps_job_b(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node daemon watches rank 0 of job A (alice) and rank 0 of job B (bob): A's stall takes
    A's stacks into A's folder; B's process is not dumped (one user's stacks never land in
    another's incident)."""
    dumped: list[int] = []

    def capture(pid: int, **kw: Any) -> DumpResult:
        dumped.append(pid)
        return _fake_capture(pid, **kw)

    monkeypatch.setattr("rankwatch.runtime.agent.capture", capture)
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    node = Identity(run="default", rank=None, local_rank=None, world_size=None, node="n")

    async def go() -> Path | None:
        agent = Agent(cfg, node)
        a = agent.add_watcher([], Identity("job-a", 0, 0, 1, "n", user="alice"))
        b = agent.add_watcher([], Identity("job-b", 0, 0, 1, "n", user="bob"))
        a.attach(os.getpid())
        b.attach(os.getppid())
        return await agent.capture_dumps("stall", run="job-a")

    folder = asyncio.run(go())
    assert folder is not None and folder.parent.name == "job-a"
    assert dumped == [os.getpid()] and os.getppid() not in dumped
    assert not (tmp_path / "dumps" / "job-b").exists()


def test_each_rank_is_dumped_without_the_ranks_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run -- python pl_train.py``: the script is rank 0 and rank 1 is its child, each with a
    pipeline of its own. Rank 0's capture sets rank 1's process apart (``others``): it would
    otherwise dump its descendants, rank 1 among them, and `dumps diff` saw one stack on every
    rank and named no suspect."""
    asked: dict[int, frozenset[int]] = {}

    def capture(pid: int, **kw: Any) -> DumpResult:
        asked[pid] = kw.get("others", frozenset())
        return _fake_capture(pid, **kw)

    monkeypatch.setattr("rankwatch.runtime.agent.capture", capture)
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    node = Identity(run="job", rank=None, local_rank=None, world_size=2, node="n")

    async def go() -> Path | None:
        agent = Agent(cfg, node)
        script = agent.add_watcher([], Identity("job", 0, 0, 2, "n"))
        child = agent.add_watcher([], Identity("job", 1, 1, 2, "n"))
        script.attach(os.getppid())
        child.attach(os.getpid())
        return await agent.capture_dumps("stall")

    assert asyncio.run(go()) is not None
    assert os.getpid() in asked[os.getppid()]  # the script's dump leaves its child rank out
    assert os.getppid() in asked[os.getpid()]  # capture only sets apart the pids below it
