"""Trust nothing shared (issue 26): the run folder cannot be turned against the agent, its host
or the job.

The agents of a run share ``<dumps>/<run>/`` (failure records, the alert board and its claims)
and beside each agent its alert spool and state file. On a shared ``/scratch`` (mode 1777,
sequential Slurm job ids) another user can make those folders first and fill them. Here that
user is ``nobody`` (``setpriv``), the agent runs as root or as the systemd unit's user with
``CAP_DAC_READ_SEARCH``, and the attacks run against the real CLI: symlinks at the predictable
temp names, a symlinked spool, a symlink to a root-only file, a forged first failure from a
rank outside the world, a far-future claim that would silence the alert and a forged board
record whose text would be sent. Below them: the same rules over the module directly, and a
property test that fills the folder with whatever a hostile user can make.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import agent_token
from faultlib import webhook

ROOT = os.geteuid() == 0
AGENT_UID = 1  # daemon: the systemd unit's user, neither root nor the job's
OTHER_UID = 65534  # nobody: another user of the node
SECRET = "RW-SECRET-db_password-51c2"
FORGED = "rm -rf /data/shared"
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (files owned by another user)")


def _env() -> dict[str, str]:
    agent = str(Path(__file__).resolve().parents[1] / "agent")
    return dict(os.environ, PYTHONPATH=agent, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")


def _setpriv(uid: int, gid: int, *, caps: bool = False) -> list[str] | None:
    tool = shutil.which("setpriv")
    if not ROOT or tool is None:
        return None
    cmd = [tool, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    if caps:
        cmd += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return cmd


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder other users can reach (pytest's tmp_path is root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="rw-runfolder-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


# The other user's script: everything it can make before the agent starts (job ids are
# sequential: it knows the run's name), then, given the agent's pid, the symlinks at the temp
# names the agent used to derive from it.
_ATTACKER = r"""
import json, os, sys, time
dumps, spool, secret, victim, forged_text, phase = sys.argv[1:7]
run = os.path.join(dumps, "sec")
ranks = os.path.join(run, ".ranks")
board = os.path.join(run, ".alerts", "crash")
now = time.time()
us = round((now - 5) * 1e6)
future = round((now + 10 * 365 * 86400) * 1e6)
if phase == "before":
    for d in (run, ranks, os.path.join(run, ".alerts"), board, spool):
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o777)
    forged = {"v": 1, "run": "sec", "rank": 7, "kind": "crash", "time": now - 5,
              "how": "forged: " + forged_text, "signal": None, "consequence": False,
              "log": "/x/rank-7.log", "node": "n"}
    for name in ("failed-7.json", f"failed-r7-{us}-f.json"):
        with open(os.path.join(ranks, name), "w") as fh:
            json.dump(forged, fh)
    for name in ("failed-5.json", f"failed-r5-{us}-f.json"):
        os.symlink(secret, os.path.join(ranks, name))
    for name in ("failed-0.json", f"failed-r0-{us}-f.json"):  # a reader would block on these
        os.mkfifo(os.path.join(ranks, name))
    # a 0-byte claim on the crash records of ranks 0 and 1, far in the future: "being sent"
    for r in (0, 1):
        open(os.path.join(board, f"claim-firing-r{r}-{future}"), "w").close()
    member = {"message": forged_text, "step": 1, "evidence": {}, "starts_at": now - 1}
    rec = {"v": 1, "run": "sec", "kind": "crash", "rank": 1, "state": "firing", "time": now - 1,
           "node": "n", "severity": "critical", "member": member}
    with open(os.path.join(board, f"r1-firing-{round((now - 1) * 1e6)}.json"), "w") as fh:
        json.dump(rec, fh)
    os.symlink(victim, os.path.join(spool, "sec.rank-0.jsonl"))
else:
    pid = int(phase)
    os.symlink(victim, os.path.join(ranks, f".failed-0.json.{pid}.tmp"))
    os.symlink(victim, os.path.join(spool, f".sec.rank-0.state.json.{pid}.tmp"))
"""

_CHILD = r"""
import os, sys, time
go = sys.argv[1]
deadline = time.monotonic() + 120
print("step=1 loss=2.0", flush=True)
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
print("Traceback (most recent call last):", flush=True)
print('  File "train.py", line 3, in <module>', flush=True)
print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
sys.exit(1)
"""


@pytest.mark.tool
@needs_root
@pytest.mark.parametrize("agent_as", ["root", "unit"])
def test_a_run_folder_another_user_made_first_is_refused_and_nothing_in_it_is_followed_or_believed(
    shared: Path, agent_as: str
) -> None:
    as_other = _setpriv(OTHER_UID, OTHER_UID)
    as_agent = [] if agent_as == "root" else _setpriv(AGENT_UID, AGENT_UID, caps=True)
    if as_other is None or as_agent is None:
        pytest.skip("needs root and setpriv(1)")
    dumps, spool = shared / "dumps", shared / "tmp" / "spool"
    for d in (dumps, spool.parent):
        d.mkdir()
        os.chmod(d, 0o1777)  # /scratch, /tmp
    secret = shared / "secret"
    secret.write_text(f'{{"db_password": "{SECRET}"}}')
    os.chmod(secret, 0o600)
    victim = shared / "victim"
    victim.write_text("ORIGINAL\n")
    os.chmod(victim, 0o644)
    attacker = shared / "attacker.py"
    attacker.write_text(_ATTACKER)
    child = shared / "child.py"
    child.write_text(_CHILD)
    out = shared / "out"
    out.mkdir()
    for p in (attacker, child):
        os.chmod(p, 0o644)
    if agent_as == "unit":
        os.chown(out, AGENT_UID, AGENT_UID)
    args = [str(dumps), str(spool), str(secret), str(victim), FORGED]
    subprocess.run([*as_other, sys.executable, str(attacker), *args, "before"], check=True, timeout=60)
    found = out / "findings.jsonl"
    err = out / "agent.err"
    with webhook() as (url, posted):
        cfg = out / "rw.yaml"
        cfg.write_text(
            "run: {name: sec, rank: 0, world_size: 2}\nlogs: {poll_interval: 50ms}\n"
            f"dumps: {{dir: {dumps}, on_stall: false}}\nserver: {{enabled: false}}\n"
            f"runner: {{log_dir: {out / 'logs'}}}\n"
            "alerts: {startup_quiet: 0s, group_wait: 0s, "
            f"spool_dir: {spool}, webhook: {{urls: ['{url}']}}}}\n"
        )
        os.chmod(cfg, 0o644)
        go = out / "go"
        command = [
            "--config",
            str(cfg),
            "--findings-jsonl",
            str(found),
            "--",
            sys.executable,
            str(child),
            str(go),
        ]
        with open(err, "wb") as e_fh:
            agent = subprocess.Popen(
                [*as_agent, sys.executable, "-m", "rankwatch", "-v", "run", *command],
                stdout=subprocess.DEVNULL,
                stderr=e_fh,
                env=_env(),
                cwd=out,
            )
        try:
            subprocess.run(
                [*as_other, sys.executable, str(attacker), *args, str(agent.pid)], check=True, timeout=60
            )
            deadline = time.monotonic() + 60
            while not (out / "logs").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            go.touch()
            assert agent.wait(timeout=120) == 1
        finally:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    agent.wait(timeout=30)
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()
        sent = list(posted)
    logs = err.read_text(errors="replace")
    findings = [json.loads(x) for x in found.read_text().splitlines()] if found.exists() else []
    # The death is told once: by its CUDA error (detectors/exit.py), or a crash naming it.
    crash = [f for f in findings if f["kind"] in ("crash", "cuda_error")]
    assert crash, logs
    # Nothing planted was followed: the root-owned file is unchanged, the secret never read.
    assert victim.read_text() == "ORIGINAL\n"
    everything = {
        "log": logs,
        "findings": found.read_text() if found.exists() else "",
        "alerts": "\n".join(sent),
    }
    for where, text in everything.items():
        assert SECRET not in text, f"the root-only file leaked into the {where}"
        assert FORGED not in text or where == "log", f"forged text reached the {where}"
        assert "rank 7" not in text.replace("rank-7", ""), (
            f"a rank outside the world was named in the {where}"
        )
    # The folder is refused loudly: once per folder, naming it and its owner.
    refusals = [x for x in logs.splitlines() if "refusing the shared run folder" in x]
    assert refusals and any(str(dumps / "sec") in x and f"uid {OTHER_UID}" in x for x in refusals), logs
    assert len(refusals) == len(set(refusals)), logs
    # The crash alert still goes out, once: the forged claim silenced nothing.
    # The job's CUDA error and its crash are one failure: one alert, whichever kind leads it.
    crash_alerts = [b for b in sent if '"firing"' in b and json.loads(b)["kind"] in ("crash", "cuda_error")]
    assert len(crash_alerts) == 1, sent


# ------------------------------------------------------------------ the module, in-process
RUN = "job"
GLOO_CLOSED = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:4020. This is typically caused by a remote worker crashing."
)
STACKS = Path(__file__).parent / "data" / "ddp_stacks"


def _cross(tmp: Path, rank: int, world: int = 2, **dumps: Any) -> tuple[Any, Any, list[Any]]:
    from rankwatch.config.schema import Config
    from rankwatch.config.snapshot import replaced
    from rankwatch.identity import Identity
    from rankwatch.records import Finding
    from rankwatch.runtime.agent import Agent
    from rankwatch.runtime.diagnose import CrossRank

    cfg = replaced(Config(), {"dumps.dir": str(tmp / "dumps"), **{f"dumps.{k}": v for k, v in dumps.items()}})
    sent: list[Finding] = []

    class Sink:
        def send(self, f: Finding) -> None:
            sent.append(f)

    agent = Agent(cfg, Identity(RUN, rank, rank, world, "n"), sinks=[Sink()])
    cross = CrossRank(agent, cfg, wall=time.time)
    agent.wire(cross_rank=cross)
    return agent, cross, sent


def _crash(rank: int, message: str, t: float) -> Any:
    from rankwatch.records import Finding, Severity

    return Finding(
        kind="crash", severity=Severity.CRITICAL, rank=rank, message=message, path=f"/logs/rank-{rank}.log",
        time=t, evidence={"signal": None, "traceback": [], "exit_code": 1},
    )  # fmt: skip


def _forged_failure(rank: int, t: float, **extra: Any) -> str:
    return json.dumps(
        {"v": 1, "run": RUN, "rank": rank, "kind": "crash", "time": t, "how": f"forged: {FORGED}",
         "signal": None, "consequence": False, "log": f"/x/rank-{rank}.log", "node": "n", **extra}
    )  # fmt: skip


def _both_names(rank: int, t: float) -> list[str]:
    """A failure record's name as this version writes it, and as the previous one did."""
    return [f"failed-r{rank}-{round(t * 1e6)}-f.json", f"failed-{rank}.json"]


@pytest.mark.unit
def test_records_state_and_spool_are_never_written_through_a_symlink_at_a_predictable_name(
    tmp_path: Path,
) -> None:
    """Item 1 and 2: symlinks planted at the temp names the agent used to derive from its pid,
    and at the spool's own name: the target (root's, when the agent is root) stays as it was."""
    from rankwatch.actions.alerts.spool import Spool, SpoolEntry, spool_path
    from rankwatch.actions.alerts.state import Remembered, StateFile, state_path

    victim = tmp_path / "victim"
    victim.write_text("ORIGINAL\n")
    agent, _, sent = _cross(tmp_path, 0)
    ranks = tmp_path / "dumps" / RUN / ".ranks"
    ranks.mkdir(parents=True, mode=0o700)
    os.chmod(ranks.parent, 0o700)
    for name in ("failed-0.json", "failed-r0-0-f.json"):
        (ranks / f".{name}.{os.getpid()}.tmp").symlink_to(victim)
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(mode=0o700)
    sp, st = spool_path(spool_dir, RUN, 0), state_path(spool_dir, RUN, 0)
    (spool_dir / f".{st.name}.{os.getpid()}.tmp").symlink_to(victim)
    sp.symlink_to(victim)
    agent.emit(_crash(0, "killed by signal 9 (SIGKILL) after step 14", time.time()))
    assert sent
    StateFile(st).save([Remembered(0, "crash", "critical", 1.0)], {"run": RUN})
    with pytest.raises(OSError):
        Spool(sp, 1 << 20).append([SpoolEntry("a", "slack", {"kind": "crash"})])
    assert victim.read_text() == "ORIGINAL\n"
    assert list(ranks.glob("failed-r0-*-f.json"))  # the record itself is written
    assert json.loads(st.read_text())["alerts"][0]["kind"] == "crash"


@pytest.mark.unit
def test_a_symlinked_ranks_folder_is_refused_and_nothing_is_written_into_its_target(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "dumps" / RUN
    run.mkdir(parents=True, mode=0o700)
    (run / ".ranks").symlink_to(elsewhere)
    agent, _, sent = _cross(tmp_path, 0)
    agent.emit(_crash(0, "killed by signal 9 (SIGKILL) after step 14", time.time()))
    assert sent and list(elsewhere.iterdir()) == []
    assert "refused" in sent[0].evidence["shared_folder"]  # the finding says why no peer was named
    assert agent.internal_errors_by_component.get("runfolder", 0) >= 1
    refused = [r.getMessage() for r in caplog.records if "refusing the shared run folder" in r.getMessage()]
    assert refused and str(run / ".ranks") in refused[0] and "symlink" in refused[0]


@pytest.mark.unit
@pytest.mark.timeout(30)
def test_a_record_linked_to_a_secret_or_dev_zero_a_fifo_or_a_huge_file_is_never_read(tmp_path: Path) -> None:
    """Items 3, 4, 5: nothing of the secret reaches the finding, /dev/zero and a 1 GiB file cost
    nothing, a FIFO blocks nothing, and the real first failure is still found."""
    import tracemalloc

    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"rank": 5, "time": time.time() - 3, "how": SECRET, "db_password": SECRET}))
    os.chmod(secret, 0o600)
    agent, _, sent = _cross(tmp_path, 0, world=8)
    ranks = tmp_path / "dumps" / RUN / ".ranks"
    ranks.mkdir(parents=True, mode=0o700)
    os.chmod(ranks.parent, 0o700)
    t = time.time() - 5
    for name in _both_names(5, t - 1):
        (ranks / name).symlink_to(secret)
    # (the new name only: the previous version, reading every record, would read /dev/zero
    # until the machine runs out of memory)
    (ranks / _both_names(4, t - 1)[0]).symlink_to("/dev/zero")
    for name in _both_names(3, t - 1):
        os.mkfifo(ranks / name)
    for name in _both_names(2, t - 1):
        with open(ranks / name, "wb") as fh:
            fh.truncate(1 << 30)  # sparse
    for name in _both_names(1, t):
        (ranks / name).write_text(_forged_failure(1, t, how="killed by signal 9 (SIGKILL)"))
    tracemalloc.start()  # a FIFO read would hang here: the test's timeout fails it
    agent.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", time.time()))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    [f] = sent
    assert SECRET not in f.message and SECRET not in json.dumps(f.evidence, default=str)
    assert f.message.startswith("rank 1 failed first: killed by signal 9 (SIGKILL)"), f.message
    assert peak < 32 << 20, peak


@pytest.mark.unit
def test_a_forged_first_failure_outside_the_world_or_from_the_future_is_ignored_and_counted(
    tmp_path: Path,
) -> None:
    """Item 8: "rank 7 failed first" in a world of 2, or a peer's record dated next year."""
    agent, _, sent = _cross(tmp_path, 0, world=2, clock_skew=5.0)
    ranks = tmp_path / "dumps" / RUN / ".ranks"
    ranks.mkdir(parents=True, mode=0o700)
    os.chmod(ranks.parent, 0o700)
    t = time.time() - 5
    for name in _both_names(7, t):
        (ranks / name).write_text(_forged_failure(7, t))
    future = time.time() + 20  # within the consequence window, beyond the skew bound below
    (ranks / f"failed-r1-{round(future * 1e6)}-f.json").write_text(_forged_failure(1, future))
    agent.emit(_crash(0, f"process exited with code 1. Cause (crash): {GLOO_CLOSED}.", time.time()))
    [f] = sent
    assert "rank 7" not in f.message and "first_failure" not in f.evidence, f.message
    assert agent.internal_errors_by_component.get("runfolder", 0) >= 1


@pytest.mark.unit
def test_a_future_record_beyond_the_configured_skew_is_not_believed(tmp_path: Path) -> None:
    from rankwatch import runfolder

    now = 1_800_000_000.0
    good = {"run": RUN, "rank": 1, "time": now + 5}
    assert runfolder.check_record(good, run=RUN, world=2, now=now, skew=10) is None
    assert "future" in (runfolder.check_record(good, run=RUN, world=2, now=now, skew=1) or "")
    assert "outside a world of 2" in (
        runfolder.check_record({**good, "rank": 7}, run=RUN, world=2, now=now) or ""
    )
    assert runfolder.check_record({**good, "run": "x"}, run=RUN, world=2, now=now) == "of another run"
    assert runfolder.check_record({**good, "rank": True}, run=RUN, world=2, now=now) == "no valid rank"
    assert runfolder.bounded("x" * 5000, 10) == "x" * 10 and runfolder.bounded(3) is None


def _dispatcher(tmp: Path, rank: int, world: int, board: Path, clock: Any) -> tuple[Any, Any]:
    from rankwatch.actions.alerts import AlertDispatcher
    from rankwatch.config.schema import AlertsConfig
    from rankwatch.identity import Identity

    class Sink:
        name = "rec"

        def __init__(self) -> None:
            self.alerts: list[Any] = []

        async def deliver(self, alert: Any) -> None:
            self.alerts.append(alert)

    sink = Sink()
    cfg = AlertsConfig(
        startup_quiet=0.0, group_wait=1.0, spool_dir=str(tmp / f"spool-{rank}"), board_dir=str(board),
        board_takeover=5.0,
    )  # fmt: skip
    ident = Identity(run=RUN, rank=rank, local_rank=rank, world_size=world, node=f"n{rank}")
    return AlertDispatcher(cfg, ident, sinks=[sink], clock=clock, wall=clock), sink


@pytest.mark.unit
def test_a_zero_byte_claim_dated_far_in_the_future_does_not_silence_the_alert(tmp_path: Path) -> None:
    """Item 8: a claim says "someone is sending this record"; one from the future is forged."""
    from conftest import FakeClock, until
    from rankwatch.records import Finding, Severity

    async def go() -> list[Any]:
        clock = FakeClock(1_800_000_000.0)
        board = tmp_path / "board"
        d, sink = _dispatcher(tmp_path, 0, 2, board, clock)
        folder = board / RUN / ".alerts" / "nan_loss"
        folder.mkdir(parents=True, mode=0o700)
        for p in (board / RUN, board / RUN / ".alerts"):
            os.chmod(p, 0o700)
        far = round((clock() + 10 * 365 * 86400) * 1e6)
        (folder / f"claim-firing-r0-{far}").touch()
        task = asyncio.create_task(d.run())
        try:
            d.send(Finding("nan_loss", Severity.CRITICAL, 0, "loss is NaN at step 7", 7))
            await until(lambda: d.settled(), 10)
            clock.advance(1.5)
            d.wake()
            await until(lambda: bool(sink.alerts), 10)
        finally:
            await d.close(1.0)
            await asyncio.wait_for(task, 5.0)
        return list(sink.alerts)

    import asyncio

    alerts = asyncio.run(go())
    assert [a.kind for a in alerts] == ["nan_loss"]


@pytest.mark.unit
@needs_root
def test_a_forged_board_record_of_another_user_never_reaches_the_alert(tmp_path: Path) -> None:
    """Item 8: rank 1's record on the board, written by another user (a hard link, or a file
    made before the folder was locked down): its text must not be sent in rank 0's message."""
    import asyncio

    from conftest import FakeClock, until
    from rankwatch.records import Finding, Severity

    async def go() -> list[Any]:
        clock = FakeClock(1_800_000_000.0)
        board = tmp_path / "board"
        d, sink = _dispatcher(tmp_path, 0, 2, board, clock)
        folder = board / RUN / ".alerts" / "stall"
        folder.mkdir(parents=True, mode=0o700)
        for p in (board / RUN, board / RUN / ".alerts"):
            os.chmod(p, 0o700)
        t = clock()
        member = {"message": FORGED, "step": 1, "evidence": {}, "starts_at": t}
        rec = {"v": 1, "run": RUN, "kind": "stall", "rank": 1, "state": "firing", "time": t, "node": "n1"}
        rec.update(severity="critical", member=member)
        forged = folder / f"r1-firing-{round(t * 1e6)}.json"
        forged.write_text(json.dumps(rec))
        os.chown(forged, OTHER_UID, OTHER_UID)
        task = asyncio.create_task(d.run())
        try:
            d.send(Finding("stall", Severity.CRITICAL, 0, "no progress for 12m on rank 0", 1200))
            await until(lambda: d.settled(), 10)
            for _ in range(4):
                clock.advance(2.0)
                d.wake()
                await until(lambda: d.settled(), 10)
            await until(lambda: bool(sink.alerts), 10)
        finally:
            await d.close(1.0)
            await asyncio.wait_for(task, 5.0)
        return list(sink.alerts)

    alerts = asyncio.run(go())
    assert alerts
    for a in alerts:
        text = json.dumps([m.message for m in a.members]) + a.title
        assert FORGED not in text, text


@pytest.mark.unit
def test_a_two_gib_sparse_spool_is_read_capped_at_start(tmp_path: Path) -> None:
    """Item 6 (spool): the read at start costs at most the spool's bound, its newest entries kept."""
    import tracemalloc

    from rankwatch.actions.alerts.spool import Spool, SpoolEntry

    path = tmp_path / "spool" / "job.rank-0.jsonl"
    path.parent.mkdir(mode=0o700)
    with open(path, "wb") as fh:
        fh.truncate(2 << 30)
        fh.seek(0, os.SEEK_END)
        fh.write(b"\n" + SpoolEntry("last", "slack", {"kind": "nan_loss"}).line())
    tracemalloc.start()
    entries = Spool(path, 1 << 20).load()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert [e.id for e in entries] == ["last"]
    assert peak < 16 << 20, peak


@pytest.mark.unit
def test_a_stuck_ranks_call_does_not_block_the_dumps_folder_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 5: one call stuck in .ranks (a FIFO, a hung mount) used to hold the one "stuck" slot
    of every dumps-folder call: SIGUSR1 dumps and /api/dumps were dead for the rest of the run."""
    import asyncio

    from rankwatch import offloop

    monkeypatch.setattr(offloop, "timeouts", {})
    monkeypatch.setattr(offloop, "_stuck", {})
    release = threading.Event()
    agent, cross, _ = _cross(tmp_path, 0)
    monkeypatch.setattr(cross, "_read_all", lambda *_: release.wait(5) and [])

    async def go() -> int:
        with pytest.raises(asyncio.TimeoutError):
            await cross._store_io(cross._first_failure, 0, time.time(), True, timeout=0.05)
        return int(await agent.dumps_io(lambda: 42, timeout=2.0))

    try:
        assert asyncio.run(go()) == 42
    finally:
        release.set()


@pytest.mark.unit
def test_a_stall_whose_peer_records_do_not_answer_still_points_at_its_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 5: the stacks are there (rank-0.txt); only the failure records hang. The finding
    must not say "Stack dumps could not be taken"."""
    import asyncio

    from rankwatch import offloop
    from rankwatch.records import Finding, Severity
    from rankwatch.runtime import diagnose

    monkeypatch.setattr(offloop, "timeouts", {})
    monkeypatch.setattr(offloop, "_stuck", {})
    monkeypatch.setattr(diagnose, "STALL_WAIT_S", 0.3)
    release = threading.Event()
    agent, cross, sent = _cross(tmp_path, 1, world=4)
    incident = tmp_path / "dumps" / RUN / "20261122T101500Z_stall"
    shutil.copytree(STACKS / "loader_hang", incident)

    async def captured(*_: Any, **__: Any) -> Path:
        return incident

    monkeypatch.setattr(agent, "capture_dumps", captured)
    monkeypatch.setattr(cross, "_read_all", lambda *_: release.wait(5) and [])

    async def go() -> None:
        agent.emit(Finding("stall", Severity.CRITICAL, 1, "no progress for 4.1s. Usual fix: x"))
        await agent.settle(10)

    try:
        asyncio.run(go())
    finally:
        release.set()
    [f] = sent
    assert "could not be taken" not in f.message, f.message
    assert str(incident) in f.message and "did not answer" in f.message, f.message


@pytest.mark.unit
def test_a_hung_dumps_folder_is_said_in_the_stall_finding_not_no_watched_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 11: the filesystem did not answer; "no watched process to dump" was false."""
    import asyncio

    from rankwatch import offloop

    monkeypatch.setattr(offloop, "timeouts", {})
    monkeypatch.setattr(offloop, "_stuck", {})
    monkeypatch.setattr(offloop, "FS_TIMEOUT_S", 0.1)
    release = threading.Event()
    agent, _, _ = _cross(tmp_path, 0)
    monkeypatch.setattr(agent, "_incident", lambda *_: release.wait(5))
    try:
        assert asyncio.run(agent.capture_dumps("stall")) is None
    finally:
        release.set()
    text = agent._outcome().text()
    assert "no watched process" not in text and "did not answer" in text, text


@pytest.mark.unit
def test_with_alertmanager_the_only_sink_the_board_steps_aside(tmp_path: Path) -> None:
    from rankwatch.actions.alerts import AlertDispatcher
    from rankwatch.config.schema import AlertsConfig
    from rankwatch.identity import Identity

    ident = Identity(run=RUN, rank=0, local_rank=0, world_size=1024, node="n")
    am = AlertsConfig(spool_dir=str(tmp_path / "spool"), alertmanager=_am_config())
    d = AlertDispatcher(am, ident, dumps_dir=tmp_path / "dumps")
    assert [s.name for s in d.sinks] == ["alertmanager"] and d.peers is None
    assert not (tmp_path / "dumps").exists()  # no board files for a thousand agents to list
    both = AlertsConfig(
        spool_dir=str(tmp_path / "spool"), alertmanager=_am_config(),
        webhook=type(am.webhook)(urls=("http://127.0.0.1:9/x",)),
    )  # fmt: skip
    assert AlertDispatcher(both, ident, dumps_dir=tmp_path / "dumps").peers is not None


def _am_config() -> Any:
    from rankwatch.config.schema import AlertmanagerConfig

    return AlertmanagerConfig(urls=("http://127.0.0.1:9093",))


@pytest.mark.unit
def test_folders_are_made_0700_or_0750_with_a_group_and_refused_when_others_may_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rankwatch import runfolder, safeio

    errors: dict[str, int] = {}
    f = runfolder.RunFolder(tmp_path, "run", ".ranks", errors=errors)
    with f.open() as d:
        d.write_json("a.json", {"x": 1})
    assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "run" / ".ranks").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "run" / ".ranks" / "a.json").st_mode) == 0o600
    gid = os.getegid()
    g = runfolder.RunFolder(tmp_path, "grouped", group=gid)
    with g.open() as d:
        d.write("b", b"x")
    st = os.stat(tmp_path / "grouped")
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_gid == gid
    assert stat.S_IMODE(os.stat(tmp_path / "grouped" / "b").st_mode) == 0o640
    os.chmod(tmp_path / "run", 0o777)
    for _ in range(3):
        with pytest.raises(safeio.Refused, match="writable by group or others"), f.open():
            pass
    assert errors == {"runfolder": 3}
    said = [r for r in caplog.records if "refusing the shared run folder" in r.getMessage()]
    assert len(said) == 1 and str(tmp_path / "run") in said[0].getMessage()


# ------------------------------------------------------------------ the property test
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

WORLD = 4
NOW = time.time()
_US = [round((NOW + d) * 1e6) for d in (-5.0, -1.0, 0.0, 3.0, 10 * 365 * 86400.0)]
_PLACES = [".ranks", ".alerts/stall", ".alerts/present", ".alerts/slack-threads", "spool"]
_WHAT = [
    "link-secret", "link-dir", "link-zero", "fifo", "device", "foreign", "huge", "malformed", "deep",
    "record", "dir", "empty",
]  # fmt: skip


def _names(place: str) -> st.SearchStrategy[str]:
    rank = st.integers(0, 9)
    us = st.sampled_from(_US)
    if place == ".ranks":
        return st.one_of(
            st.builds(lambda r, u, c: f"failed-r{r}-{u}-{c}.json", rank, us, st.sampled_from("fc")),
            st.builds(lambda r, u, w: f"profile-r{r}-{u}-w{w}.json", rank, us, st.integers(0, 1000)),
            st.builds(lambda r: f"failed-{r}.json", rank),
        )
    if place == ".alerts/stall":
        return st.one_of(
            st.builds(lambda r, u: f"r{r}-firing-{u}.json", rank, us),
            st.builds(lambda r, u: f"claim-firing-r{r}-{u}", rank, us),
            st.builds(lambda r, u: f"sent-firing-r{r}-{u}-abcdef.json", rank, us),
        )
    if place == ".alerts/present":
        return st.builds(lambda r: f"r{r}.json", rank)
    if place == ".alerts/slack-threads":
        return st.builds(lambda r: f"stall-r{r}.json", rank)
    return st.sampled_from([f"{RUN}.rank-0.jsonl", f"{RUN}.rank-0.state.json"])


_ENTRY = st.sampled_from(_PLACES).flatmap(
    lambda p: st.tuples(
        st.just(p), _names(p), st.sampled_from(_WHAT), st.integers(0, 9), st.sampled_from(_US)
    )
)


def _doc(name: str, rank: int, us: int, text: str) -> dict[str, Any]:
    """A record as a peer writes it, carrying ``text`` (the secret, where the file is forged)."""
    t = us / 1e6
    if name.startswith("sent-"):
        return {"v": 1, "status": "firing", "by": rank, "time": t, "covers": {str(rank): us, "9": us}}
    if name.startswith("r") and "-" in name:
        member = {"message": text, "step": 1, "evidence": {"x": text}, "starts_at": t}
        return {"v": 1, "run": RUN, "kind": "stall", "rank": rank, "state": "firing", "time": t, "node": "n",
                "severity": "critical", "member": member}  # fmt: skip
    if name.startswith("stall-r"):
        return {"ts": text, "channel": "C1", "time": t}
    return {"v": 1, "run": RUN, "rank": rank, "time": t, "how": text, "consequence": False, "log": text}


def _plant(folder: Path, name: str, what: str, rank: int, us: int, outside: Path) -> None:
    path = folder / name
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if what == "link-secret":
        path.symlink_to(outside / "secret")
    elif what == "link-dir":
        path.symlink_to(outside / "dir")
    elif what == "link-zero":
        path.symlink_to("/dev/zero")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
        except PermissionError:
            path.write_text("{")  # no mknod here: that draw is a malformed file instead
    elif what == "huge":
        with open(path, "wb") as fh:
            fh.truncate(1 << 31)
    elif what == "malformed":
        path.write_bytes(b'{"rank": 1, "time": ')
    elif what == "deep":
        path.write_text("[" * 50_000 + "]" * 50_000)
    elif what == "dir":
        path.mkdir()
    elif what == "empty":
        path.touch()
    else:
        path.write_text(json.dumps(_doc(name, rank, us, SECRET if what == "foreign" else "peer")))
        if what == "foreign":
            os.chown(path, OTHER_UID, OTHER_UID) if ROOT else os.chmod(path, 0o666)


def _snapshot(outside: Path) -> dict[str, tuple[int, bytes]]:
    out = {}
    for p in sorted(outside.rglob("*")):
        if p.is_file():
            out[str(p)] = (p.stat().st_mtime_ns, p.read_bytes())
        else:
            out[str(p)] = (p.stat().st_mtime_ns, b"")
    return out


def _bounded(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a thread, which must end within seconds: nothing may block."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except OSError as e:  # the folder refused (or a FIFO to append to): said, never followed
            box["value"] = e
        except BaseException as e:  # reported below, on the test's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"{getattr(fn, '__name__', fn)} blocked"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.mark.unit
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(_ENTRY, max_size=10), replace=st.sampled_from([None, "link", "foreign", "open"]))
def test_whatever_is_planted_in_the_run_folder_nothing_outside_is_touched_nothing_blocks_no_foreign_rank(
    tmp_path_factory: pytest.TempPathFactory,
    entries: list[tuple[str, str, str, int, int]],
    replace: str | None,
) -> None:
    from rankwatch.actions.alerts.board import Board, Marker, Record
    from rankwatch.actions.alerts.spool import Spool, SpoolEntry, spool_path
    from rankwatch.actions.alerts.state import Remembered, StateFile, state_path
    from rankwatch.actions.alerts.threads import ThreadStore
    from rankwatch.runfolder import RunFolder

    tmp = tmp_path_factory.mktemp("planted")
    outside = tmp / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret").write_text(SECRET)
    os.chmod(outside / "secret", 0o600)
    (outside / "dir" / "file").write_text(SECRET)
    _, cross, _ = _cross(tmp, 0, world=WORLD)
    alerts = RunFolder(tmp / "dumps", RUN, ".alerts")
    for sub in ("stall", "present", "slack-threads"):
        with alerts.child(sub).open():
            pass
    with cross.folder.open():
        pass
    spool_dir = tmp / "spool"
    with RunFolder(spool_dir).open():
        pass
    places = {".ranks": cross.shared, "spool": spool_dir}
    for place, name, what, rank, us in entries:
        folder = places.get(place) or tmp / "dumps" / RUN / place
        _plant(folder, name, what, rank, us, outside)
    run = tmp / "dumps" / RUN
    if replace == "link":
        shutil.rmtree(run / ".ranks")
        (run / ".ranks").symlink_to(outside / "dir")
    elif replace == "foreign" and ROOT:
        os.chown(run / ".alerts", OTHER_UID, OTHER_UID)
    elif replace == "open":
        os.chmod(run, 0o777)
    before = _snapshot(outside)

    now = time.time()
    named: list[Any] = []
    mine = {"rank": 0, "kind": "crash", "time": now, "how": "x", "signal": None, "consequence": True}
    named.append(_bounded(cross._record_failure, 0, now, True, mine))
    named.append(_bounded(cross._first_failure, 0, now, True))
    _bounded(cross._write_profile, {"rank": 0, "time": now, "waiting": 0.5, "top": None})
    named.extend(_bounded(cross._read_all, "profile-"))
    board = Board(alerts, RUN, 600.0, world=WORLD)
    member = {"message": "m", "step": 1, "evidence": {}, "dump_path": None, "starts_at": now}
    _bounded(board.post, [Record(RUN, "stall", 0, "firing", now, "n", "critical", member)])
    _bounded(board.present, [0], "n", now)
    view = _bounded(board.view, "stall", now, [0])
    if not isinstance(view, OSError):
        named.extend([*view.records, *view.present, *(m for _, m in view.claims)])
        named.extend(m for marker in view.markers for m in marker.covers)
        loaded = _bounded(board.load, list(view.records.values()))
        if not isinstance(loaded, OSError):
            named.extend(rec for rec in loaded.values() if rec is not None)
        named.append(_bounded(board.claim, "stall", "firing", {0: round(now * 1e6)}))
        _bounded(board.mark, "stall", Marker("firing", 0, now, {0: round(now * 1e6)}))
    threads = ThreadStore(alerts.child("slack-threads"))
    named.append(_bounded(threads.get, "stall", [0, 1, 2, 3], "C1", now))
    _bounded(threads.put, "stall", [0], "C1", "1.0001", now)
    spool = Spool(spool_path(spool_dir, RUN, 0), 1 << 20)
    named.append(_bounded(spool.load))
    _bounded(spool.append, [SpoolEntry("a", "slack", {"kind": "stall"})])
    state = StateFile(state_path(spool_dir, RUN, 0))
    named.append(_bounded(state.load))
    _bounded(state.save, [Remembered(0, "stall", "critical", now)], {"run": RUN})

    assert _snapshot(outside) == before, "something outside the run folder was written"
    text = repr(named)
    assert SECRET not in text, "a planted file's content was read through a link or believed"
    for x in named:
        rank = x.get("rank") if isinstance(x, dict) else getattr(x, "rank", x)
        rank = rank[0] if isinstance(rank, tuple) else rank
        if isinstance(rank, int) and not isinstance(rank, bool):
            assert rank < WORLD, f"rank {rank} outside the world of {WORLD} was named: {x!r}"


# Several agents of a run share a board that another user (or a crashed writer) littered:
# every alert still goes out, once, and nothing planted reaches it.
T0 = 1_800_000_000.0
_BOARD_US = [round(T0 * 1e6), round((T0 - 30) * 1e6), round((T0 + 10 * 365 * 86400) * 1e6)]
_JUNK = [
    "link-secret",
    "fifo",
    "device",
    "foreign",
    "foreign-empty",
    "huge",
    "malformed",
    "future",
    "outside",
]


def _board_names() -> st.SearchStrategy[str]:
    rank, us = st.integers(0, 9), st.sampled_from(_BOARD_US)
    return st.one_of(
        st.builds(lambda r, u: f"nan_loss/r{r}-firing-{u}.json", rank, us),
        st.builds(lambda r, u: f"nan_loss/claim-firing-r{r}-{u}", rank, us),
        st.builds(lambda r, u: f"nan_loss/sent-firing-r{r}-{u}-abcdef.json", rank, us),
        st.builds(lambda r: f"present/r{r}.json", rank),
    )


def _plant_board(board: Path, name: str, what: str, outside: Path) -> None:
    path = board / name
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    kind = "sent" if "/sent-" in name else "claim" if "/claim-" in name else "record"
    m = name.split("/")[-1]
    rank = int("".join(ch for ch in m.split("-")[0 if kind == "record" else 2] if ch.isdigit()) or 0)
    us = _BOARD_US[0]
    member = {"message": SECRET, "step": 1, "evidence": {}, "starts_at": us / 1e6}
    doc: dict[str, Any] = {"v": 1, "run": RUN, "kind": "nan_loss", "rank": rank, "state": "firing"}
    doc.update(time=us / 1e6, node="n", severity="critical", member=member)
    if kind == "sent":
        doc = {"v": 1, "status": "firing", "by": rank, "time": us / 1e6, "covers": {"0": us, "1": us}}
    if what == "link-secret":
        path.symlink_to(outside / "secret")
    elif what == "fifo":
        os.mkfifo(path)
    elif what == "device":
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:
            path.write_text("{")
    elif what == "huge":
        with open(path, "wb") as fh:
            fh.truncate(1 << 31)
    elif what == "malformed":
        path.write_bytes(b'{"v": 1, "run": ')
    elif what in ("foreign", "foreign-empty"):
        path.write_text("" if what == "foreign-empty" else json.dumps(doc))
        os.chown(path, OTHER_UID, OTHER_UID) if ROOT else os.chmod(path, 0o666)
    elif what == "future":  # same user, but dated beyond the skew bound: forged or a clock far off
        later = round((T0 + 10 * 365 * 86400) * 1e6)
        parts = name.rsplit("-", 1) if kind != "sent" else name.rsplit("-", 2)
        future = f"{parts[0]}-{later}" + (
            ".json" if kind == "record" else "-abcdef.json" if kind == "sent" else ""
        )
        with contextlib.suppress(FileNotFoundError):  # an earlier plant may have left a FIFO there
            (board / future).unlink()
        (board / future).write_text(json.dumps({**doc, "time": later / 1e6, "member": {"message": SECRET}}))
    else:  # "outside": same user, well formed, but of a rank outside the world
        if rank < 2:
            return
        path.write_text(json.dumps(doc))


@pytest.mark.unit
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.lists(st.tuples(_board_names(), st.sampled_from(_JUNK)), max_size=8))
def test_with_a_littered_board_every_alert_of_every_agent_still_goes_out_once(
    tmp_path_factory: pytest.TempPathFactory, junk: list[tuple[str, str]]
) -> None:
    import asyncio

    from conftest import FakeClock, until
    from rankwatch.records import Finding, Severity

    tmp = tmp_path_factory.mktemp("board")
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "secret").write_text(SECRET)
    board = tmp / "board"
    from rankwatch.runfolder import RunFolder

    alerts = RunFolder(board, RUN, ".alerts")
    for sub in ("nan_loss", "present"):
        with alerts.child(sub).open():
            pass
    for name, what in junk:
        _plant_board(board / RUN / ".alerts", name, what, outside)

    async def go() -> list[Any]:
        clock = FakeClock(T0)
        pairs = [_dispatcher(tmp, r, 2, board, clock) for r in range(2)]
        tasks = [asyncio.create_task(d.run()) for d, _ in pairs]
        try:
            for r, (d, _) in enumerate(pairs):
                d.send(Finding("nan_loss", Severity.CRITICAL, r, f"loss is NaN at step 7 on rank {r}", 7))
            for _ in range(12):  # group_wait, then takeovers (5 s each)
                await until(lambda: all(d.settled() for d, _ in pairs), 10)
                clock.advance(2.0)
                for d, _ in pairs:
                    d.wake()
            await until(lambda: all(d.settled() for d, _ in pairs), 10)
        finally:
            for d, _ in pairs:
                await d.close(1.0)
            for t in tasks:
                await asyncio.wait_for(t, 5.0)
        return [a for _, s in pairs for a in s.alerts]

    alerts_sent = asyncio.run(go())
    firing = [a for a in alerts_sent if a.status == "firing" and a.kind == "nan_loss"]
    ranks = sorted(m.rank for a in firing for m in a.members)
    assert ranks == [0, 1], [(a.title, [m.rank for m in a.members]) for a in alerts_sent]
    text = repr([(a.title, [(m.rank, m.message, m.evidence) for m in a.members]) for a in alerts_sent])
    assert SECRET not in text


@pytest.mark.process
def test_a_fifo_in_the_ranks_folder_leaves_the_crash_and_the_dumps_api_alive(tmp_path: Path) -> None:
    """Item 5, live: the job (the agent's own user) puts a FIFO where a peer's failure record
    goes. A crash makes the agent read the records: that read must not block, and /api/dumps
    must keep answering (it used to share one "stuck" slot with the records: 503 for good)."""
    import asyncio

    import aiohttp

    from conftest import until
    from rankwatch.config.schema import Config
    from rankwatch.config.snapshot import replaced
    from rankwatch.identity import Identity
    from rankwatch.runtime.modes import watch_processes

    dumps = tmp_path / "dumps"
    ranks = dumps / RUN / ".ranks"
    ranks.mkdir(parents=True, mode=0o700)
    os.chmod(ranks.parent, 0o700)
    t = time.time() - 2
    for name in _both_names(1, t):
        os.mkfifo(ranks / name)
    log = tmp_path / "rank-0.log"
    log.write_text("step=1 loss=2.0\n")
    cfg = replaced(Config(), {"dumps.dir": str(dumps), "server.listen": "127.0.0.1:0"})
    ident = Identity(run=RUN, rank=0, local_rank=0, world_size=2, node="n")

    async def go() -> tuple[list[int], float, list[Any]]:
        started: list[Any] = []
        stop = asyncio.Event()
        sent: list[Any] = []

        class Sink:
            def send(self, f: Any) -> None:
                sent.append(f)

        task = asyncio.create_task(
            watch_processes(
                cfg, ident, pids=[], match=None, logs=[log], sinks=[Sink()], stop=stop,
                services={"on_start": started.append},
            )
        )  # fmt: skip
        try:
            assert await until(lambda: bool(started) or task.done(), 20)
            svc = started[0]
            begun = time.monotonic()
            svc.agent.emit(_crash(0, "killed by signal 9 (SIGKILL) after step 1", time.time()))
            await until(lambda: bool(sent), 20)
            took = time.monotonic() - begun
            statuses = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
                for _ in range(3):
                    auth = {"Authorization": f"Bearer {agent_token()}"}  # the token it made
                    async with s.get(svc.server.url + "/api/dumps", headers=auth) as r:
                        statuses.append(r.status)
            return statuses, took, sent
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)

    statuses, took, sent = asyncio.run(go())
    assert statuses == [200, 200, 200], statuses
    assert took < 2.5, f"the crash waited {took:.1f}s on the FIFO"
    assert [f.kind for f in sent if f.kind == "crash"] == ["crash"]
