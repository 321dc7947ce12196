"""runtime/diagnose.py without processes: the shared first-failure records, the stall message
built from a real incident's stacks, the straggler verdict. The live paths are
tests/test_ddp_real.py."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ticks_during
from rankwatch import offloop
from rankwatch.config.loader import load_config
from rankwatch.dumps.diff import diff_incident
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity
from rankwatch.runtime import diagnose
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.diagnose import CrossRank

pytestmark = pytest.mark.unit

STACKS = Path(__file__).parent / "data" / "ddp_stacks"
GLOO_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:4020. This is typically caused by a remote worker crashing."
)


def _agent(tmp: Path, rank: int, world: int = 4, dumps: str = "") -> tuple[Agent, CrossRank, list[Finding]]:
    cfg_path = tmp / "rw.yaml"
    more = f", {dumps}" if dumps else ""
    cfg_path.write_text(f"dumps: {{dir: {tmp / 'dumps'}{more}}}\n")
    cfg = load_config(str(cfg_path))
    sent: list[Finding] = []

    class Sink:
        def send(self, f: Finding) -> None:
            sent.append(f)

    agent = Agent(cfg, Identity("job", rank, rank, world, "n"), sinks=[Sink()])
    cross = CrossRank(agent, cfg, wall=lambda: 1000.0 + rank)
    agent.wire(cross_rank=cross)
    return agent, cross, sent


def _crash(rank: int, message: str, signal: int | None = None, t: float | None = None) -> Finding:
    return Finding(
        kind="crash",
        severity=Severity.CRITICAL,
        rank=rank,
        message=message,
        path=f"/logs/rank-{rank}.log",
        time=t,
        evidence={"signal": signal, "traceback": [], "exit_code": None},
    )


def test_a_peers_gloo_failure_names_the_rank_killed_first(tmp_path: Path) -> None:
    agent3, _, _ = _agent(tmp_path, 3)
    agent0, _, sent0 = _agent(tmp_path, 0)
    dead = _crash(3, "killed by signal 9 (SIGKILL) after step 14. SIGKILL with no traceback ...", 9, 1000.0)
    agent3.emit(dead)
    [path] = (tmp_path / "dumps" / "job" / ".ranks").glob("failed-r3-*-f.json")
    record = json.loads(path.read_text())
    assert record["rank"] == 3 and record["signal"] == 9 and not record["consequence"]
    agent0.emit(
        _crash(0, f"process exited with code 1 after step 14. Cause (crash): {GLOO_CLOSED}.", None, 1000.4)
    )
    [f] = sent0
    assert f.message.startswith("rank 3 failed first: killed by signal 9 (SIGKILL) after step 14 at ")
    assert "0.4s before this rank" in f.message and "(its log: /logs/rank-3.log)" in f.message
    assert f.diagnosis is not None and f.diagnosis.first_failure is not None
    assert f.diagnosis.first_failure.rank == 3 and f.diagnosis.suspect == 3


def test_a_peer_failure_that_comes_first_waits_for_the_first_failures_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(diagnose, "FAILURE_POLL_S", 0.02)

    async def scenario() -> list[Finding]:
        agent0, _, sent0 = _agent(tmp_path, 0)
        agent3, _, _ = _agent(tmp_path, 3)
        agent0.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", None, 1000.4))
        assert sent0 == []  # held: its text says a peer died
        await asyncio.sleep(0.06)  # a few polls of the folder find nothing yet
        agent3.emit(_crash(3, "killed by signal 9 (SIGKILL) after step 14", 9, 1000.0))
        await agent0.settle(5)
        return sent0

    [f] = asyncio.run(scenario())
    assert f.message.startswith("rank 3 failed first") and f.evidence["cross_rank"]


def test_an_own_failure_is_not_a_consequence(tmp_path: Path) -> None:
    agent1, _, sent1 = _agent(tmp_path, 1)
    agent1.emit(
        _crash(1, "process exited with code 1. Cause (oom): torch.OutOfMemoryError: CUDA out of memory", t=5)
    )
    [f] = sent1
    assert "failed first" not in f.message


def test_stall_message_names_the_suspect_and_fits_the_verdict(tmp_path: Path) -> None:
    _, cross, _ = _agent(tmp_path, 1)
    for name, rank, want, unwanted in [
        ("loader_hang", 1, "This rank only waits in all_reduce (DDP gradient", "real error"),
        ("loader_hang", 2, "this rank's data loading is stuck (its DataLoader worker", "only waits"),
        ("barrier", 1, "the ranks called different collectives", "real error"),
    ]:
        folder = tmp_path / name
        shutil.copytree(STACKS / name, folder, dirs_exist_ok=True)
        dumps = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in folder.glob("rank-*.json")}
        result = diff_incident(dumps, world_size=4)
        stall = Finding(
            kind="stall",
            severity=Severity.CRITICAL,
            rank=rank,
            message="no progress for 4.1s (timeout 4.0s); last step 15; process alive, idle on CPU "
            "(0.0%): blocked in a collective or I/O. Judged from: step lines. Usual fix: `rankwatch dumps "
            "diff` names the rank whose stack differs; the others wait for it in the collective, and its "
            "log holds the real error.",
        )
        first: dict[str, Any] | None = None
        cross._complete_stall(stall, folder, result, result.activities.get(rank), first)
        assert want in stall.message, stall.message
        assert unwanted not in stall.message, stall.message
        assert "Stacks are being captured" not in stall.message
        assert stall.diagnosis is not None and stall.diagnosis.incident == str(folder)


def test_stall_after_a_peer_died_names_it(tmp_path: Path) -> None:
    _, cross, _ = _agent(tmp_path, 0)
    folder = tmp_path / "inc"
    shutil.copytree(STACKS / "loader_hang", folder)
    for r in (2, 3):
        (folder / f"rank-{r}.json").unlink()
    dumps = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in folder.glob("rank-*.json")}
    result = diff_incident(dumps, world_size=3)
    stall = Finding(
        kind="stall", severity=Severity.CRITICAL, rank=0, message="no progress for 5s. Usual fix: x"
    )
    first = {
        "rank": 2,
        "how": "killed by signal 9 (SIGKILL) after step 14",
        "time": 1000.0,
        "log": "/l/rank-2.log",
    }
    cross._complete_stall(stall, folder, result, result.activities.get(0), first)
    assert "Rank 2 failed first: killed by signal 9 (SIGKILL) after step 14 at " in stall.message
    assert "read rank 2's log and fix that failure; nothing to fix on this rank" in stall.message
    assert stall.diagnosis is not None
    assert stall.diagnosis.suspects == (2,) and stall.diagnosis.verdict == "first_failure"
    assert stall.diagnosis.world_size == 3 and stall.diagnosis.missing == (2,)
    assert "This rank is waiting in" in stall.message


def test_straggler_verdict(tmp_path: Path) -> None:
    _, cross1, sent1 = _agent(tmp_path, 1)
    _, cross0, sent0 = _agent(tmp_path, 0)
    profiles = [{"rank": r, "waiting": w, "top": "computing at compute (train.py:76)"} for r, w in
                [(0, 0.75), (1, 0.12), (2, 0.88), (3, 0.75)]]  # fmt: skip
    drop = (
        "throughput dropped to 4.5 steps/s, 34% of its baseline 13 steps/s. Usual causes: ... GPU clocks ..."
    )
    f1 = Finding(kind="throughput_drop", severity=Severity.WARNING, rank=1, message=drop)
    cross1._judge_straggler(f1, profiles[1], profiles)
    [straggler] = [f for f in sent1 if f.kind == "straggler"]
    assert straggler.rank == 1 and straggler.message.startswith("rank 1 is the straggler")
    assert "This rank is the straggler" in f1.message and "GPU clocks" not in f1.message
    f0 = Finding(kind="throughput_drop", severity=Severity.WARNING, rank=0, message=drop)
    cross0._judge_straggler(f0, profiles[0], profiles)
    assert sent0 == []  # no straggler finding on a waiting rank
    assert "Rank 1 is the straggler" in f0.message and "GPU clocks" not in f0.message
    # Every rank waits about as much: a job-wide slowdown, no straggler named.
    even = [{"rank": r, "waiting": 0.5} for r in range(4)]
    f2 = Finding(kind="throughput_drop", severity=Severity.WARNING, rank=0, message=drop)
    cross0._judge_straggler(f2, even[0], even)
    assert f2.message == drop and f2.diagnosis is None
    # The verdict is typed: the straggler finding and both drops name rank 1 in their diagnosis.
    for f in (straggler, f1, f0):
        assert f.diagnosis is not None and (f.diagnosis.suspect, f.diagnosis.verdict) == (1, "straggler")


def test_a_straggler_is_one_alert_naming_it(tmp_path: Path) -> None:
    """c16 (s35 tester, torch 2.13 gloo, ``torchrun --tee 3``, rank 1 5x slower): rank 0's
    throughput drop, rank 1's straggler finding and rank 1's own drop, in the order the agent
    emitted them, through the alert policy to the webhook payload: one alert, suspect rank 1, in
    the job's run (s35 batch 2, d18: the straggler finding went out under the agent's own run)."""
    from rankwatch.actions.alerts._webhook import payload
    from rankwatch.actions.alerts.message import AlertMessage
    from rankwatch.actions.alerts.policy import AlertPolicy
    from rankwatch.config.schema import AlertsConfig

    _, cross, sent = _agent(tmp_path, 0, world=2)
    waiting = [{"rank": 0, "waiting": 0.625, "top": None}, {"rank": 1, "waiting": 0.0, "top": None}]
    drop = "throughput dropped to 0.99 steps/s, 25% of its baseline 4 steps/s. Usual causes: a straggler GPU"

    def judged(rank: int) -> Finding:
        # Stamped by its pipeline with its job's run (torchrun's id, not the agent's `default`).
        f = Finding(
            "throughput_drop", Severity.WARNING, rank, drop, 30, time=1000.0, run="job18", world_size=2
        )
        cross._judge_straggler(f, waiting[rank], waiting)
        return f

    f0 = judged(0)
    f1 = judged(1)
    [straggler] = [f for f in sent if f.kind == "straggler"]
    out: list[AlertMessage] = []
    t = [2000.0]
    cfg = AlertsConfig(startup_quiet=0.0, group_wait=2.0, repeat_interval=0.0)
    p = AlertPolicy(
        cfg, Identity("default", None, None, None, "n"), out.append, clock=lambda: t[0], wall=lambda: t[0]
    )
    p.restart([], None, {})
    p.start(t[0])
    for f in (f0, straggler, f1):
        p.take(f)
    t[0] += 2.0
    p.pump(t[0])
    p.pump(t[0] + 60.0)
    docs = [payload(m) for m in out]
    assert [(d["summary"], d["suspect"]) for d in docs] == [
        ("throughput_drop on 2 of 2 ranks, suspect rank 1", 1)
    ]
    assert docs[0]["diagnosis"]["verdict"] == "straggler"
    assert (docs[0]["run"], docs[0]["world_size"]) == ("job18", 2)  # the straggler's job, not the agent's


# --- the shared folder off the loop ------------------------------------------------------
IO_TIMEOUT = 0.08
STUCK_CAP_S = 3.0  # a blocked call on the loop's own thread (the old code) gives up after this


@pytest.fixture
def hung(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """A shared-folder call that blocks until the test ends (a dead NFS/Lustre mount); offloop's
    timeout for the failure path made short and its counters and stuck-call memory fresh."""
    # raising=False: run against code that did this I/O on the loop, the tests fail, not error
    monkeypatch.setattr(diagnose, "FAILURE_IO_S", IO_TIMEOUT, raising=False)
    monkeypatch.setattr(offloop, "timeouts", {})
    monkeypatch.setattr(offloop, "_stuck", {})
    release = threading.Event()

    def block(*_: Any, **__: Any) -> Any:
        release.wait(STUCK_CAP_S)  # bounded, so code that blocks the loop fails instead of hanging
        return []

    yield block
    release.set()


def test_a_hung_shared_folder_neither_blocks_the_loop_nor_loses_the_crash(
    tmp_path: Path,
    hung: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    agent, cross, sent = _agent(tmp_path, 0)
    monkeypatch.setattr(cross, "_read_all", hung)
    monkeypatch.setattr(cross, "_write", hung)
    message = "killed by signal 9 (SIGKILL) after step 14. SIGKILL with no traceback ..."

    async def crash_and_shut_down() -> tuple[list[Finding], float]:
        start = time.monotonic()
        agent.emit(_crash(0, message, 9, 1000.0))
        at_once = list(sent)
        await agent.settle(5)  # what the agent does on its way out: a held finding is not dropped
        assert sent, "the held crash was dropped at shutdown"
        return at_once, time.monotonic() - start

    async def scenario() -> tuple[tuple[list[Finding], float], int, float]:
        return await ticks_during(crash_and_shut_down())

    (at_once, took), ticks, _ = asyncio.run(scenario())
    assert ticks >= 5, f"the loop turned {ticks} times in {took:.2f}s: the folder's hang blocked it"
    assert at_once == []  # held while the folder is asked, off the loop
    assert IO_TIMEOUT * 0.9 <= took < IO_TIMEOUT + 2.0  # out after the store's timeout, not the hang's end
    [f] = sent  # once
    assert f.kind == "crash" and f.message == message and f.diagnosis is None
    assert agent.internal_errors_by_component == {"dumps": 1}
    assert offloop.timeouts == {diagnose.RANKS_IO: 1}
    assert sum("a blocking call did not return" in r.getMessage() for r in caplog.records) == 1


def test_the_failure_records_are_read_and_written_off_the_loops_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []

    def on_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            threads.append(threading.get_ident())
            return fn(*args)

        return wrapped

    async def scenario() -> tuple[int, list[Finding]]:
        agent3, cross3, _ = _agent(tmp_path, 3)
        agent0, cross0, sent0 = _agent(tmp_path, 0)
        for cross in (cross3, cross0):
            monkeypatch.setattr(cross, "_read_all", on_thread(cross._read_all))
            monkeypatch.setattr(cross, "_write", on_thread(cross._write))
        agent3.emit(_crash(3, "killed by signal 9 (SIGKILL) after step 14", 9, 1000.0))
        await agent3.settle(5)
        agent0.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", None, 1000.4))
        await agent0.settle(5)
        return threading.get_ident(), sent0

    loop_thread, sent0 = asyncio.run(scenario())
    assert threads and loop_thread not in threads
    [f] = sent0
    assert f.message.startswith("rank 3 failed first: killed by signal 9 (SIGKILL) after step 14 at ")
    assert f.diagnosis is not None and f.diagnosis.suspect == 3 and f.evidence["cross_rank"]


def test_what_a_rank_reports_while_its_failure_is_held_comes_after_it(
    tmp_path: Path, hung: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    agent, cross, sent = _agent(tmp_path, 0)
    monkeypatch.setattr(cross, "_read_all", hung)

    def finding(kind: str, rank: int = 0, resolved: bool = False) -> Finding:
        return Finding(kind=kind, severity=Severity.WARNING, rank=rank, message=kind, resolved=resolved)

    async def scenario() -> None:
        agent.emit(_crash(0, "killed by signal 9 (SIGKILL) after step 14", 9, 1000.0))
        agent.emit(finding("loss_spike"))
        agent.emit(finding("stall", resolved=True))
        agent.emit(finding("oom"))  # a second failure: recorded in its turn, after the first
        agent.emit(finding("loss_spike", rank=1))  # another rank's: not held
        assert [(f.kind, f.rank) for f in sent] == [("loss_spike", 1)]
        await agent.settle(5)

    asyncio.run(scenario())
    assert [(f.kind, f.rank, f.resolved) for f in sent] == [
        ("loss_spike", 1, False),
        ("crash", 0, False),
        ("loss_spike", 0, False),
        ("stall", 0, True),
        ("oom", 0, False),
    ]
    # The oom asked the folder while the crash's call was still stuck: given up at once.
    assert agent.internal_errors_by_component == {"dumps": 2}


def test_the_stall_alert_names_the_suspect_the_diagnosis_found(tmp_path: Path) -> None:
    """The diagnosis's suspect reaches the alert title, the webhook and Alertmanager payloads, and
    survives the spool: one typed structure between the layers, not string keys."""
    from rankwatch.actions.alerts._alertmanager import payload as am_payload
    from rankwatch.actions.alerts._webhook import payload as hook_payload
    from rankwatch.actions.alerts.message import AlertMember, AlertMessage

    _, cross, _ = _agent(tmp_path, 1)
    folder = tmp_path / "loader_hang"
    shutil.copytree(STACKS / "loader_hang", folder)
    dumps = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in folder.glob("rank-*.json")}
    result = diff_incident(dumps, world_size=4)
    stall = Finding(
        kind="stall", severity=Severity.CRITICAL, rank=1, message="no progress for 21s. Usual fix: x"
    )
    cross._complete_stall(stall, folder, result, result.activities.get(1), None)
    assert stall.diagnosis is not None and stall.diagnosis.suspect == 2 and stall.diagnosis.world_size == 4
    member = AlertMember(1, stall.message, diagnosis=stall.diagnosis, starts_at=1.0)
    alert = AlertMessage("job", "stall", Severity.CRITICAL, "firing", [member], "n", world_size=4)
    assert alert.title == "stall on rank 1, suspect rank 2"
    assert hook_payload(alert)["suspect"] == 2
    assert hook_payload(alert)["diagnosis"]["incident"] == str(folder)
    [doc] = am_payload(alert, 2.0)
    assert doc["annotations"]["suspect"] == "2" and "suspect rank 2" in doc["annotations"]["summary"]
    again = AlertMessage.from_json(json.loads(json.dumps(alert.to_json())))
    assert again.suspect == 2 and again.title == alert.title


def test_a_node_daemon_keeps_each_jobs_failures_apart(tmp_path: Path) -> None:
    """A node daemon watches two jobs: job A's rank 3 killed first is no first failure of job
    B's rank 0 (its own run's folder holds no record), while job A's rank 0 names it."""
    agent, _, sent = _agent(tmp_path, 0)
    dead = _crash(3, "killed by signal 9 (SIGKILL) after step 14. SIGKILL with no traceback ...", 9, 1000.0)
    dead.run = "jobA"
    agent.emit(dead)
    [path] = (tmp_path / "dumps" / "jobA" / ".ranks").glob("failed-r3-*-f.json")
    assert json.loads(path.read_text())["run"] == "jobA"
    assert not (tmp_path / "dumps" / "job" / ".ranks").exists()
    other = _crash(
        0, f"process exited with code 1 after step 14. Cause (crash): {GLOO_CLOSED}.", None, 1000.4
    )
    other.run = "jobB"
    agent.emit(other)
    same = _crash(0, f"process exited with code 1 after step 14. Cause (crash): {GLOO_CLOSED}.", None, 1000.5)
    same.run = "jobA"
    agent.emit(same)
    by_run = {f.run: f for f in sent if f.rank == 0}
    assert "failed first" not in by_run["jobB"].message
    assert by_run["jobA"].message.startswith("rank 3 failed first: killed by signal 9")
    assert by_run["jobA"].diagnosis is not None and by_run["jobA"].diagnosis.suspect == 3


def test_a_rank_that_exits_cleanly_early_is_the_first_failure_its_peers_name(tmp_path: Path) -> None:
    """Rank 2 returns from main with status 0 while its peers enter the next all-reduce: gloo's
    `Connection closed by peer` on rank 0 is a consequence, named after rank 2's exit. A peer's
    failure of its own is not blamed on a clean exit."""
    agent2, _, _ = _agent(tmp_path, 2)
    agent0, _, sent0 = _agent(tmp_path, 0)
    agent1, _, sent1 = _agent(tmp_path, 1)
    agent2.clean_exit(2, 50, 1000.0)
    [path] = (tmp_path / "dumps" / "job" / ".ranks").glob("failed-r2-*-x.json")  # x: a clean exit
    record = json.loads(path.read_text())
    assert record["kind"] == "exit" and not record["consequence"]
    agent0.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", None, 1000.5))
    [f] = sent0
    assert f.message.startswith(
        "rank 2 failed first: exited with status 0 at step 50 while its peers went on"
    )
    assert f.diagnosis is not None and f.diagnosis.suspect == 2
    assert f.diagnosis.first_failure is not None and f.diagnosis.first_failure.kind == "exit"
    agent1.emit(
        _crash(
            1, "process exited with code 1. Cause (oom): torch.OutOfMemoryError: CUDA out of memory", t=1000.6
        )
    )
    [own] = sent1
    assert "failed first" not in own.message  # its own failure: the first one, its own suspect
    assert own.diagnosis is not None and own.diagnosis.suspect == 1


def test_dumps_diff_blames_the_rank_the_incident_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 2 left the job, so the incident holds stacks of ranks 0, 1 and 3 only. The live
    diagnosis recorded the world size and the first failure in the incident: `dumps diff`
    blames rank 2, not the lowest rank whose stack it has."""
    from rankwatch.cli import main
    from rankwatch.dumps.store import DumpStore

    _, cross, _ = _agent(tmp_path, 0)
    folder = tmp_path / "dumps" / "job" / "20261128T020000Z_stall"
    shutil.copytree(STACKS / "loader_hang", folder)
    for p in folder.glob("rank-2.*"):
        p.unlink()
    dumps = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in folder.glob("rank-*.json")}
    result = diff_incident(dumps, world_size=4)
    first = {"rank": 2, "kind": "exit", "time": 1000.0, "how": "exited with status 0 at step 50"}
    asyncio.run(cross._record_incident(folder, result, first))
    recorded = DumpStore(tmp_path / "dumps").load_diagnosis(DumpStore(tmp_path / "dumps").find(str(folder)))
    assert recorded is not None and recorded.world_size == 4 and recorded.missing == (2,)
    assert main(["dumps", "diff", str(folder), "--dir", str(tmp_path / "dumps")]) == 0
    out = capsys.readouterr().out
    assert "rank 2: no dump" not in out or "suspect: rank 2" in out, out
    assert "suspect: rank 2 (rank 2 failed first: exited with status 0 at step 50)" in out, out
    assert main(["dumps", "diff", str(folder), "--dir", str(tmp_path / "dumps"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["suspects"] == [2] and doc["world_size"] == 4 and doc["diagnosis"]["suspect"] == 2


# gloo's texts as torch 2.13 prints them (tests/test_launch_matrix.py runs the jobs that print them)
GLOO_RESET = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:28370: Connection reset by peer. This is typically caused by a remote worker hitting "
    "an error."
)


def _listener(agent: Agent, rank: int, *addresses: str) -> None:
    """A watched process of ``agent`` whose sockets' local ends were ``addresses`` (what its
    prober read)."""
    from types import SimpleNamespace

    agent.watchers.append(
        SimpleNamespace(  # type: ignore[arg-type]
            rank=rank,
            identity=agent.identity,
            path=f"/logs/rank-{rank}.log",
            prober=SimpleNamespace(addresses=tuple(addresses)),
            pids=lambda: [],
        )
    )


def test_peer_address_is_read_from_the_real_gloo_texts() -> None:
    closed = Finding("peer_error", Severity.WARNING, 0, GLOO_CLOSED, evidence={"peer": "127.0.0.1:4020"})
    assert diagnose.peer_address(closed) == "127.0.0.1:4020"
    crash = _crash(0, f"process exited with code 1. Cause (peer_error): {GLOO_RESET}")
    assert diagnose.peer_address(crash) == "127.0.0.1:28370"
    assert diagnose.peer_address(_crash(0, "killed by signal 9 (SIGKILL) [127.0.0.1]:1")) is None


def test_gloo_prints_the_peers_port_in_network_byte_order() -> None:
    """Seen on torch 2.13 (CPU, two ranks on loopback): rank 1 listened on 127.0.0.1:43617, and
    rank 0's error said ``Connection closed by peer [127.0.0.1]:25002`` (0xAA61 -> 0x61AA)."""
    assert diagnose._listened("127.0.0.1:25002", ["::ffff:127.0.0.1:35416", "127.0.0.1:43617"])
    assert diagnose._listened("127.0.0.1:43617", ["0.0.0.0:43617"])
    assert not diagnose._listened("127.0.0.1:25002", ["127.0.0.1:25003", "10.0.0.9:43617"])


def test_the_address_gloo_lost_names_the_rank_that_listened_there(tmp_path: Path) -> None:
    """Ranks 2 and 1 both left (2 first); rank 0's gloo error names the address it lost, which
    rank 1's process listened on: rank 1 is named, not the earlier exit of rank 2."""
    agent1, _, _ = _agent(tmp_path, 1)
    agent2, _, _ = _agent(tmp_path, 2)
    agent0, _, sent0 = _agent(tmp_path, 0)
    _listener(agent1, 1, "0.0.0.0:4020", "127.0.0.1:29500")
    _listener(agent2, 2, "127.0.0.1:4077")
    agent2.clean_exit(2, 50, 1000.0)
    agent1.clean_exit(1, 50, 1000.2)
    record = json.loads(next((tmp_path / "dumps" / "job" / ".ranks").glob("failed-r1-*-x.json")).read_text())
    assert record["addresses"] == ["0.0.0.0:4020", "127.0.0.1:29500"]
    agent0.emit(_crash(0, f"process exited with code 1. Cause (peer_error): {GLOO_CLOSED}.", None, 1000.5))
    [f] = sent0
    assert f.message.startswith("rank 1 failed first: exited with status 0 at step 50"), f.message
    assert "the connection gloo lost (127.0.0.1:4020) was to rank 1" in f.message
    assert f.diagnosis is not None and f.diagnosis.suspect == 1


def test_a_watched_rank_whose_exit_status_is_unknown_is_the_first_failure_its_peers_name(
    tmp_path: Path,
) -> None:
    """`watch --pid`, the sidecar: the agent is not the rank's parent, so a rank that left
    (exit 0, or SIGKILL) is "exit status unknown". Recorded as a possible first failure, it is
    what a peer's gloo error names, and the finding itself goes out as it is (info)."""
    agent1, _, sent1 = _agent(tmp_path, 1)
    agent0, _, sent0 = _agent(tmp_path, 0)
    _listener(agent1, 1, "127.0.0.1:4020")
    gone = Finding(
        "process_exit",
        Severity.INFO,
        1,
        "watched process exited (exit status unknown: not this agent's child; no error in its log)",
        step=7,
        time=1000.0,
        evidence={"status_known": False},
    )
    agent1.emit(gone)
    assert [f.kind for f in sent1] == ["process_exit"]
    agent0.emit(
        _crash(0, f"process exited (exit status unknown: not our child). Cause: {GLOO_CLOSED}", t=1000.3)
    )
    [f] = sent0
    assert f.message.startswith(
        "rank 1 failed first: exited at step 7 while its peers went on (its exit status"
    )
    assert f.diagnosis is not None and f.diagnosis.suspect == 1


def test_a_launchers_worker_that_listened_on_the_lost_address_is_named_without_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One agent for a launcher's workers: rank 1's process listened on the address rank 0's
    gloo lost, and no record of rank 1's end came within the wait: the process table names it."""
    agent, _, sent = _agent(tmp_path, 0, dumps="first_failure_wait: 0.05s")
    _listener(agent, 0, "127.0.0.1:4001")
    _listener(agent, 1, "127.0.0.1:28370")

    async def scenario() -> None:
        agent.emit(_crash(0, f"process exited with code 1. Cause (peer_error): {GLOO_RESET}", t=1000.0))
        await agent.settle(5)

    asyncio.run(scenario())
    [f] = sent
    assert f.message.startswith("the connection gloo lost (127.0.0.1:28370) was to rank 1: look at rank 1")
    assert f.diagnosis is not None and f.diagnosis.suspect == 1


def _process(agent: Agent, rank: int, started: float) -> None:
    """A watched process of ``agent`` (rank ``rank``) that started at ``started`` (wall clock)."""
    from types import SimpleNamespace

    agent.watchers.append(
        SimpleNamespace(  # type: ignore[arg-type]
            rank=rank,
            identity=agent.identity,
            path=f"/logs/rank-{rank}.log",
            prober=SimpleNamespace(addresses=(), started=started),
            pids=lambda: [],
        )
    )


def _records(tmp: Path, run: str = "job") -> list[str]:
    return sorted(p.name for p in (tmp / "dumps" / run / ".ranks").glob("failed-*"))


def test_a_job_whose_ranks_all_end_well_leaves_no_failure_record(tmp_path: Path) -> None:
    """One agent per rank (srun): rank 0 ends first, and its exit record stays while rank 1 may
    still need it; once rank 1 ends too, every rank of the world ended well: no record is left
    for the next job in the same run folder to believe."""
    agent0, _, _ = _agent(tmp_path, 0, world=2)
    agent1, _, _ = _agent(tmp_path, 1, world=2)
    _process(agent0, 0, 990.0)
    _process(agent1, 1, 990.1)
    agent0.clean_exit(0, 80, 1000.0)
    assert [n[-6:] for n in _records(tmp_path)] == ["x.json"]
    agent1.clean_exit(1, 80, 1000.1)
    assert _records(tmp_path) == []


def test_the_launchers_exit_0_withdraws_its_workers_exit_records(tmp_path: Path) -> None:
    """`run -- torchrun` on one node of two: its workers (ranks 0, 1 of 4) end well and torchrun
    exits 0; their exit records are withdrawn, after they were written (on threads of their
    own), while another node's rank 2 keeps its own."""
    agent, _, _ = _agent(tmp_path, 0, world=4)
    other, _, _ = _agent(tmp_path, 2, world=4)
    agent.launched = True
    _process(agent, 0, 990.0)
    _process(agent, 1, 990.0)
    _process(other, 2, 990.0)
    other.clean_exit(2, 80, 999.0)

    async def scenario() -> None:
        agent.clean_exit(0, 80, 1000.0, "job")
        agent.clean_exit(1, 80, 1000.1, "job")
        agent.clean_exit(None, None, 1000.2, "job")  # the launcher's exit 0
        await agent.settle(10)

    asyncio.run(scenario())
    assert [n.split("-")[1] for n in _records(tmp_path)] == ["r2"]


def test_an_earlier_jobs_records_are_never_this_jobs_first_failure(tmp_path: Path) -> None:
    """A job of the same run name left records (rank 1's exit at step 80, and rank 0's); a new
    job started at 995 in the same folder, where rank 1 raises at 1000.1 and rank 0's gloo
    error follows: rank 1's failure is recorded (the old record is no incident of this job) and
    rank 0 names it, not the earlier job's exit."""
    old0, _, _ = _agent(tmp_path, 0, world=2)
    old1, _, _ = _agent(tmp_path, 1, world=2)
    old0.clean_exit(0, 80, 970.0)
    old1.clean_exit(1, 80, 970.1)  # no process start known: kept (an agent that cannot tell)
    assert len(_records(tmp_path)) == 2
    agent0, _, sent0 = _agent(tmp_path, 0, world=2)
    agent1, _, sent1 = _agent(tmp_path, 1, world=2)
    _process(agent0, 0, 995.0)
    _process(agent1, 1, 995.0)
    agent1.emit(
        _crash(1, "process exited with code 1. Cause (crash): RuntimeError: bad batch at step 10", t=1000.1)
    )
    [own] = sent1
    assert "failed first" not in own.message and own.diagnosis is not None and own.diagnosis.suspect == 1
    assert any(n.startswith("failed-r1-1000100000-f") for n in _records(tmp_path)), _records(tmp_path)
    agent0.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", None, 1000.5))
    [f] = sent0
    assert f.message.startswith("rank 1 failed first: process exited with code 1"), f.message
    assert "step 80" not in f.message
    assert f.diagnosis is not None and f.diagnosis.first_failure is not None
    assert f.diagnosis.first_failure.time == pytest.approx(1000.1)


def test_a_failure_after_its_own_exit_record_replaces_it(tmp_path: Path) -> None:
    """A launcher's worker judged clean before the launcher's word came (exit record), then
    reported failed: its failure replaces the exit record, and a peer names the failure."""
    agent, _, _ = _agent(tmp_path, 1, world=2)
    agent0, _, sent0 = _agent(tmp_path, 0, world=2)
    _process(agent, 1, 990.0)
    _process(agent0, 0, 990.0)
    agent.clean_exit(1, 12, 1000.0)
    agent.emit(_crash(1, "killed by signal 9 (SIGKILL) after step 12", 9, 1000.2))
    assert [n[-6:] for n in _records(tmp_path)] == ["f.json"]
    agent0.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", None, 1000.5))
    [f] = sent0
    assert f.message.startswith("rank 1 failed first: killed by signal 9"), f.message


# The lines rank 0 wrote after the user's Ctrl-C (s35 black-box batch 2, cell d17: torch 2.13 gloo,
# `rankwatch run -- torchrun --nproc-per-node 2 --tee 3`, rank 1 hung, then SIGINT): its peer died
# first on the same SIGINT, and its own KeyboardInterrupt is chained on the lost connection.
CTRL_C_CHAINED = [
    "Traceback (most recent call last):",
    '  File "/work/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 979, in '
    "_engine_run_backward",
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:912. This is typically caused by a remote worker crashing.",
    "During handling of the above exception, another exception occurred:",
    "Traceback (most recent call last):",
    '  File "/work/bb2/train.py", line 44, in main',
    '  File "/work/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 989, in '
    "_engine_run_backward",
    "KeyboardInterrupt",
]


@pytest.mark.parametrize("stopped", [True, False])
def test_a_lost_peer_ending_in_the_users_own_ctrl_c_is_no_finding(tmp_path: Path, stopped: bool) -> None:
    """After the agent forwarded the user's SIGINT, a rank's lost connection with the interrupt
    chained on it is the stop: no `peer_error`, and no failure record that would make the rank
    "the first failure" of a later diagnosis. Without a stop from the agent it stays a finding."""
    agent, _, sent = _agent(tmp_path, 0, world=2)
    if stopped:
        agent.stops_sent.append(signal.SIGINT)
    f = Finding(
        kind="peer_error",
        severity=Severity.WARNING,
        rank=0,
        message="KeyboardInterrupt (last step 7). The collective backend (gloo) or the c10d store lost its "
        "connection to a peer",
        step=7,
        path="/logs/rank-0.log",
        time=1000.0,
        evidence={"lines": CTRL_C_CHAINED},
    )
    agent.emit(f)
    assert bool([s for s in sent if s.kind == "peer_error"]) is not stopped
    if stopped:
        assert not list((tmp_path / "dumps").rglob("failed-*")), "the stop is no rank's failure"


def test_a_rank_the_launcher_stopped_is_never_the_first_failure(tmp_path: Path) -> None:
    """Both ranks raise at the same step (the s35b tester's d31/d47): torchrun saw rank 1 exit 1,
    then sent SIGTERM to rank 0, still tearing down; rank 0's end is judged first. A death by the
    launcher's stop signal is a consequence (tagged ``c``): rank 1's own failure, judged after it,
    is the first failure and names nobody before it, and rank 0's names rank 1."""
    from rankwatch.detectors.exit import ExitDetector
    from rankwatch.events import ProcessExit
    from rankwatch.records import ErrorRecord
    from rankwatch.state import RankState

    state = RankState(rank=0)
    state.errors.append(
        ErrorRecord(
            kind="crash",
            severity=Severity.CRITICAL,
            summary="RuntimeError: injected failure in rank 0 at step 12",
            rank=0,
            evidence=["Traceback (most recent call last):", "RuntimeError: injected failure in rank 0"],
        )
    )
    stopped = ExitDetector(0, "/logs/rank-0.log").judge(
        state, ProcessExit(None, 15, requested=15, wall=1000.0, stopped_by="the launcher sent")
    )
    assert stopped is not None and stopped.message.startswith("after the stop signal the launcher sent")
    assert stopped.evidence["stopped_by"] == "the launcher sent"
    agent0, _, _ = _agent(tmp_path, 0, world=2)
    agent1, _, sent1 = _agent(tmp_path, 1, world=2)
    agent0.emit(stopped)
    assert [p.name[-6:] for p in (tmp_path / "dumps" / "job" / ".ranks").glob("failed-r0-*")] == ["c.json"]
    agent1.emit(_crash(1, "process exited with code 1. Cause (crash): RuntimeError: injected", t=1000.2))
    [own] = sent1
    assert "failed first" not in own.message
    assert own.diagnosis is not None and own.diagnosis.suspect == 1
    assert own.diagnosis.first_failure is not None and own.diagnosis.first_failure.rank == 1


def test_a_consequence_waiting_across_a_restart_still_finds_its_attempts_first_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`torchrun --max-restarts`: rank 0's gloo error (attempt 0, process started at 990) waits
    for rank 1's crash record; before it comes, torchrun restarts rank 0 (its new process starts
    at 1003). Rank 1's record (1000.0) is of rank 0's failed attempt: it is named, not passed
    over as an earlier attempt's (the s35b tester's d11, once its stale record went)."""
    monkeypatch.setattr(diagnose, "FAILURE_POLL_S", 0.02)

    async def scenario() -> list[Finding]:
        agent0, _, sent0 = _agent(tmp_path, 0, world=2)
        agent1, _, _ = _agent(tmp_path, 1, world=2)
        _process(agent0, 0, 990.0)
        _process(agent1, 1, 990.0)
        agent0.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", None, 1000.4))
        await asyncio.sleep(0.06)
        agent0.watchers[-1].prober.started = 1003.0  # type: ignore[union-attr]  # the restart
        agent1.emit(_crash(1, "process exited with code 1. Cause (crash): RuntimeError: boom", None, 1000.0))
        await agent0.settle(5)
        return sent0

    [f] = asyncio.run(scenario())
    assert f.message.startswith("rank 1 failed first"), f.message


def test_gloos_failed_setup_is_a_consequence_so_ranks_failing_so_together_name_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """d11's attempt 1 (the tester's real text): both ranks fail in init_process_group with gloo's
    `connectFullMesh failed ... Connection refused` within 60 ms, rank 1 first. Neither is the
    other's cause (the peer each could not reach was the last attempt's): no rank is named."""
    monkeypatch.setattr(diagnose, "FAILURE_POLL_S", 0.02)
    text = (
        "process exited with code 1. Cause (crash): RuntimeError: Gloo connectFullMesh failed with "
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out connecting: "
        "SO_ERROR: Connection refused, remote=[127.0.0.1]:38304$0."
    )

    async def scenario() -> list[Finding]:
        agent0, _, sent0 = _agent(tmp_path, 0, world=2, dumps="first_failure_wait: 0.1s")
        agent1, _, _ = _agent(tmp_path, 1, world=2, dumps="first_failure_wait: 0.1s")
        agent1.emit(_crash(1, text.replace("38304$0", "30111$1"), None, 1000.47))
        agent0.emit(_crash(0, text, None, 1000.53))
        await agent1.settle(5)
        await agent0.settle(5)
        return sent0

    [f] = asyncio.run(scenario())
    assert "failed first" not in f.message, f.message
    assert f.diagnosis is None or f.diagnosis.suspect is None, f.diagnosis
    assert all(n.endswith("-c.json") for n in _records(tmp_path)), _records(tmp_path)


@pytest.mark.parametrize(
    "how",
    [
        # s35b d46 (a typo in the script's path under torchrun; CPython's Modules/main.c text)
        "/work/venv/bin/python3 could not open the script '/work/bb2/trian.py': [Errno 2] No such file "
        "or directory",
        # s35b d47 (a missing module imported by every rank)
        "process exited with code 1. Cause (crash): ModuleNotFoundError: No module named 'flash_attn_x'",
    ],
)
def test_ranks_that_failed_the_same_way_name_no_suspect(tmp_path: Path, how: str) -> None:
    """Both ranks fail with the same error (d46, d47): the second is no consequence of the first
    — whichever agent recorded first — and no rank is the one to look at."""
    agent0, _, sent0 = _agent(tmp_path, 0, world=2)
    agent1, _, sent1 = _agent(tmp_path, 1, world=2)
    agent1.emit(_crash(1, how.replace("rank 0", "rank 1") + ".", None, 1000.30))
    agent0.emit(_crash(0, how + ".", None, 1000.31))
    [f1], [f0] = sent1, sent0
    assert f0.message.startswith("rank 1 failed the same way, at once: a cause common to the ranks"), (
        f0.message
    )
    assert "consequence" not in f0.message
    assert (
        f0.diagnosis is not None and f0.diagnosis.suspect is None and f0.diagnosis.verdict == "same_failure"
    )
    assert f1.diagnosis is not None and f1.diagnosis.suspect == 1  # alone so far: its own first failure
    # One alert for both: no suspect in its title or payload, whichever member leads it.
    from rankwatch.actions.alerts._webhook import payload as hook_payload
    from rankwatch.actions.alerts.message import AlertMember, AlertMessage

    for order in ((f1, f0), (f0, f1)):
        members = [AlertMember(f.rank, f.message, diagnosis=f.diagnosis, starts_at=1.0) for f in order]
        alert = AlertMessage(
            "job", "crash", Severity.CRITICAL, "firing", members, "n", world_size=2, saw_all=True
        )
        assert alert.title == "crash on 2 of 2 ranks", alert.title
        doc = hook_payload(alert)
        assert doc["suspect"] is None and doc["diagnosis"]["verdict"] == "same_failure", doc


def test_ranks_that_failed_differently_still_name_the_first(tmp_path: Path) -> None:
    """The same rule must not swallow a real first failure: rank 1's RuntimeError, then rank 0's
    own (different) error a moment later: rank 1 failed first."""
    agent0, _, sent0 = _agent(tmp_path, 0, world=2)
    agent1, _, _ = _agent(tmp_path, 1, world=2)
    agent1.emit(
        _crash(1, "process exited with code 1. Cause (crash): RuntimeError: bad batch 160.", None, 1000.3)
    )
    agent0.emit(
        _crash(0, "process exited with code 1. Cause (crash): ValueError: shapes differ.", None, 1000.5)
    )
    [f0] = sent0
    assert f0.message.startswith("rank 1 failed first"), f0.message
    assert f0.diagnosis is not None and f0.diagnosis.suspect == 1


def _stopped_own(rank: int) -> Finding:
    """Rank ``rank`` raised its own error, then died of the SIGTERM torchrun sent it (the real
    texts of the s38 tester's g58: tests/data/blackbox/s38/repro/g58/out-1.txt)."""
    from rankwatch.detectors.exit import ExitDetector
    from rankwatch.events import ProcessExit
    from rankwatch.records import ErrorRecord
    from rankwatch.state import RankState

    state = RankState(rank=rank)
    state.errors.append(
        ErrorRecord(
            kind="crash",
            severity=Severity.CRITICAL,
            summary=f"RuntimeError: injected failure in rank {rank} at step 5",
            rank=rank,
            evidence=[
                "Traceback (most recent call last):",
                f"RuntimeError: injected failure in rank {rank} at step 5",
            ],
        )
    )
    f = ExitDetector(rank, f"/logs/rank-{rank}.log").judge(
        state, ProcessExit(None, 15, requested=15, wall=1000.3, stopped_by="the launcher sent")
    )
    assert f is not None and f.severity == Severity.WARNING and f.evidence["stopped_by"]
    return f


def test_a_stopped_ranks_own_error_is_the_first_failure_when_no_peer_failed_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """g58 (a race of torch): rank 1 raised; rank 0 then aborted in gloo (a consequence), and
    torchrun's poll saw rank 0 die first and sent SIGTERM to rank 1, still tearing down. No rank
    failed on its own but rank 1: its error is the first failure — a critical page naming rank 1
    — and a consequence judged after it names rank 1 too."""
    monkeypatch.setattr(diagnose, "FAILURE_POLL_S", 0.02)

    async def scenario() -> tuple[list[Finding], list[Finding]]:
        agent0, _, sent0 = _agent(tmp_path, 0, world=2, dumps="first_failure_wait: 0.1s")
        agent1, _, sent1 = _agent(tmp_path, 1, world=2, dumps="first_failure_wait: 0.1s")
        agent1.emit(_stopped_own(1))
        await agent1.settle(5)
        agent0.emit(_crash(0, f"killed by signal 6 (SIGABRT). Cause (peer_error): {GLOO_CLOSED}.", 6, 1000.2))
        await agent0.settle(5)
        return sent0, sent1

    sent0, sent1 = asyncio.run(scenario())
    [own] = sent1
    assert own.severity == Severity.CRITICAL, own.message
    assert own.message.startswith(
        "this rank failed first: its own error, before the stop signal the launcher sent"
    )
    assert "RuntimeError: injected failure in rank 1" in own.message
    assert own.diagnosis is not None and own.diagnosis.suspect == 1
    assert own.diagnosis.first_failure is not None and own.diagnosis.first_failure.rank == 1
    [peer] = sent0
    assert peer.message.startswith("rank 1 failed first"), peer.message
    assert peer.diagnosis is not None and peer.diagnosis.suspect == 1


def test_a_stopped_rank_whose_peer_failed_on_its_own_stays_a_consequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """d31 live (every rank raises at once; torchrun saw rank 1's exit 1 first): rank 0, stopped
    with an error of its own, is judged first and waits; rank 1's own failure comes: rank 0's
    names rank 1, stays a warning, and is never promoted to a first failure."""
    monkeypatch.setattr(diagnose, "FAILURE_POLL_S", 0.02)

    async def scenario() -> tuple[list[Finding], list[Finding]]:
        agent0, _, sent0 = _agent(tmp_path, 0, world=2, dumps="first_failure_wait: 2s")
        agent1, _, sent1 = _agent(tmp_path, 1, world=2, dumps="first_failure_wait: 2s")
        agent0.emit(_stopped_own(0))
        await asyncio.sleep(0.06)
        agent1.emit(_crash(1, "process exited with code 1. Cause (crash): RuntimeError: injected", t=1000.1))
        await agent1.settle(5)
        await agent0.settle(5)
        return sent0, sent1

    sent0, sent1 = asyncio.run(scenario())
    [stopped] = sent0
    assert stopped.severity == Severity.WARNING and stopped.message.startswith("rank 1 failed first")
    assert stopped.diagnosis is not None and stopped.diagnosis.suspect == 1
    [own] = sent1
    assert own.diagnosis is not None and own.diagnosis.suspect == 1 and "failed first" not in own.message
    assert not [n for n in _records(tmp_path) if n.startswith("failed-r0-") and n.endswith("-f.json")]


def test_one_pipeline_whose_log_holds_the_jobs_ranks_names_its_first_own_failure(tmp_path: Path) -> None:
    """`run -- python spawn.py` (torch.multiprocessing.spawn: no process shows a rank): one
    pipeline, no peers, and its log is the whole job's. The first failure of a rank of its own
    is the suspect (the s38 tester's g21); a peer's lost connection before it, or a later
    rank's failure after it, names nobody."""
    from rankwatch.runtime.judge import CrossRankWhenPeers

    cfg_path = tmp_path / "rw.yaml"
    cfg_path.write_text(f"dumps: {{dir: {tmp_path / 'dumps'}}}\n")
    cfg = load_config(str(cfg_path))
    sent: list[Finding] = []

    class Sink:
        def send(self, f: Finding) -> None:
            sent.append(f)

    agent = Agent(cfg, Identity("job", None, None, None, "n"), sinks=[Sink()])
    judge = CrossRankWhenPeers(agent, cfg)
    agent.wire(cross_rank=judge)
    agent.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", t=1000.0))
    agent.emit(_crash(1, "killed by signal 9 (SIGKILL) after step 9. SIGKILL usually means", 9, 1000.1))
    agent.emit(_crash(2, "process exited with code 1. Cause (crash): RuntimeError: later", t=1000.2))
    consequence, first, later = sent
    assert consequence.diagnosis is None and later.diagnosis is None
    assert first.diagnosis is not None and first.diagnosis.suspect == 1
    assert first.diagnosis.first_failure is not None and first.diagnosis.first_failure.rank == 1
    assert first.diagnosis.first_failure.how == "killed by signal 9 (SIGKILL) after step 9"
    assert judge.judge is None  # no peers: the run folder's judgement is not made


def test_a_peers_timeout_after_a_stall_named_the_hung_rank_is_that_hangs_consequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The s39 tester's k18: rank 1 hung, the stall's judgement named it; 25 s later gloo's
    timeout ends rank 0 ("Timed out waiting 25000ms for recv"), a consequence with no failure
    record to follow. It names rank 1 (verdict ``hang``), not nobody. Rank 1's own failure
    after its stall is no consequence of itself."""
    monkeypatch.setattr(diagnose, "FAILURE_POLL_S", 0.02)
    timeout = (
        "process exited with code 1 after step 7. Cause (crash): RuntimeError: [../third_party/gloo/gloo/"
        "transport/tcp/unbound_buffer.cc:81] Timed out waiting 25000ms for recv operation to complete"
    )

    async def scenario() -> list[Finding]:
        agent0, cross0, sent0 = _agent(tmp_path, 0, world=2, dumps="first_failure_wait: 0.1s")
        stall = Finding("stall", Severity.CRITICAL, 0, "no progress", 7, time=990.0)
        stall.diagnosed(suspects=(1,), verdict="not_in_collective", incident="/d/job/x_stall")
        cross0._remember_hang(stall)
        agent0.emit(_crash(0, timeout, t=1000.0))
        await agent0.settle(5)
        return sent0

    [f] = asyncio.run(scenario())
    assert f.message.startswith("rank 1 hung first"), f.message
    assert f.diagnosis is not None and f.diagnosis.suspect == 1 and f.diagnosis.verdict == "hang"
    assert f.diagnosis.incident == "/d/job/x_stall"
