"""Sidecar mode: `rankwatch watch` attaches to a process and log it did not start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest


def _config(tmp: Path) -> Path:
    cfg = tmp / "rw.yaml"
    cfg.write_text(
        f"run: {{name: side, rank: 0}}\ndetectors: {{warmup_steps: 5}}\nprocess: {{sample_interval: 200ms}}\n"
        f"dumps: {{dir: {tmp / 'dumps'}}}\nserver: {{listen: '127.0.0.1:0'}}\n"
    )
    return cfg


def _findings(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _wait(pred, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def _reap(*procs: subprocess.Popen | None) -> None:
    """Whatever a test started and is still running is killed and waited for."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait(10)


def _trainer(log: Path, marker: str, *args: str) -> subprocess.Popen:
    fh = open(log, "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rankwatch.demo.trainer",
                "--format",
                "kv",
                "--step-time",
                "0.05",
                "--seed",
                marker,
                *args,
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    finally:
        fh.close()


@pytest.mark.process
def test_watch_pid_and_log_finds_nan_then_sees_the_exit(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.touch()
    found = tmp_path / "f.jsonl"
    trainer = _trainer(log, "11", "--steps", "80", "--fault", "nan@40")
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rankwatch",
            "watch",
            "--config",
            str(_config(tmp_path)),
            "--pid",
            str(trainer.pid),
            "--log",
            str(log),
            "--findings-jsonl",
            str(found),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait(lambda: any(f["kind"] == "nan_loss" for f in _findings(found)))
        nan = next(f for f in _findings(found) if f["kind"] == "nan_loss")
        assert nan["step"] == 40 and nan["run"] == "side"
        trainer.wait(timeout=30)
        assert _wait(lambda: any(f["kind"] in ("process_exit", "crash") for f in _findings(found)))
        exits = [f for f in _findings(found) if f["kind"] in ("process_exit", "crash")]
        assert exits[0]["severity"] != "critical"  # a clean finish seen from outside is not a crash
        assert agent.wait(timeout=20) == 0  # --pid alone: nothing can come back, the agent is done
        assert trainer.returncode == 0
    finally:
        _reap(agent, trainer)


@pytest.mark.process
def test_watch_match_finds_a_restarted_process(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.touch()
    found = tmp_path / "f.jsonl"
    errfile = tmp_path / "agent.err"
    marker = "90210"
    first = _trainer(log, marker, "--steps", "100000")
    with errfile.open("w") as err_out:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-u",
                "-m",
                "rankwatch",
                "-v",
                "watch",
                "--config",
                str(_config(tmp_path)),
                "--match",
                f"--seed {marker}",
                "--log",
                str(log),
                "--findings-jsonl",
                str(found),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err_out,
            text=True,
        )
    second = None

    def said(text: str) -> bool:
        return text in errfile.read_text(errors="replace")

    try:
        # Each step waits on the line that says it happened, never on a fixed pause.
        assert _wait(lambda: said(f"watching pid {first.pid}"), 60), errfile.read_text()[-2000:]
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert _wait(lambda: any(f["kind"] in ("crash", "process_exit") for f in _findings(found)), 60)
        second = _trainer(log, marker, "--steps", "100000")
        assert _wait(lambda: said(f"watching pid {second.pid}"), 60), errfile.read_text()[-2000:]
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)
    finally:
        _reap(agent, first, second)


@pytest.mark.process
def test_watch_match_without_logs_watches_every_rank_and_follows_its_stdout(tmp_path: Path) -> None:
    """A node daemon: `watch --match` alone finds each rank process (not the launcher shell
    that also matches), labels it with the rank from its environment and follows its stdout."""
    marker = "77001"
    trainer = f"{sys.executable} -m rankwatch.demo.trainer --format kv --step-time 0.05 --seed {marker}"
    script = " & ".join(
        f"RANK={r} LOCAL_RANK={r} {trainer} --rank {r} --world-size 2 --steps 100000 "
        f"--fault nan@40:rank=1 > {tmp_path / f'out-{r}.txt'} 2>&1"
        for r in range(2)
    )
    launcher = subprocess.Popen(
        ["sh", "-c", f"{script} & wait # launcher {marker}"],
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    found = tmp_path / "f.jsonl"
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(_config(tmp_path)),
         "--match", f"--seed {marker}", "--findings-jsonl", str(found)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert _wait(lambda: any(f["kind"] == "nan_loss" for f in _findings(found))), _findings(found)
        nans = [f for f in _findings(found) if f["kind"] == "nan_loss"]
        assert {f["rank"] for f in nans} == {1}, nans
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=20)
        assert "rank 0: pid" in err and "rank 1: pid" in err and "out-1.txt" in err, err[-3000:]
        assert f"pid {launcher.pid}" not in err  # the launcher matched too, but is not a rank
    finally:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        if agent.poll() is None:
            agent.kill()


@pytest.mark.process
def test_restarted_watch_rebuilds_state_from_the_log_without_reporting_history_again(
    tmp_path: Path,
) -> None:
    """An agent (re)started next to a running rank re-reads the log's recent history: it knows
    the last step at once, does not alert again on the old NaN, and alerts on a new one."""
    log = tmp_path / "rank-0.log"
    with open(log, "w") as fh:
        for s in range(1, 201):
            loss = "nan" if s == 150 else f"{3.0 - s / 1000:.4f}"
            fh.write(f"step={s} loss={loss} grad_norm=0.5 lr=0.0003 step_time=0.100\n")
    found = tmp_path / "f.jsonl"
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(_config(tmp_path)),
         "--log", str(log), "--findings-jsonl", str(found)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert agent.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(agent.stderr or ()), daemon=True)
    reader.start()
    try:
        # The new lines must come after the replay, as a rank's next steps do: wait for it
        # (a fixed sleep lost the race to a slow interpreter start).
        assert _wait(lambda: any("replayed the last" in ln for ln in lines), 30), "".join(lines)[-3000:]
        with open(log, "a") as fh:
            fh.write("step=201 loss=2.7990 grad_norm=0.5 lr=0.0003 step_time=0.100\n")
            fh.write("step=202 loss=nan grad_norm=nan lr=0.0003 step_time=0.100\n")
        assert _wait(lambda: any(f["kind"] == "nan_loss" for f in _findings(found)), 20)
        nans = [f for f in _findings(found) if f["kind"] == "nan_loss"]
        assert [f["step"] for f in nans] == [202], nans
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=20)
        reader.join(timeout=10)
        err = "".join(lines)
        assert "replayed the last 200 lines" in err and "last step 200" in err, err[-3000:]
        assert "nan_loss x1" in err, err[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()


@pytest.mark.process
def test_watch_pid_that_does_not_exist_is_a_usage_error(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "watch", "--config", str(_config(tmp_path)),
         "--pid", str(dead.pid)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"no process with pid {dead.pid}" in out.stderr


@pytest.mark.process
def test_watch_pid_of_a_launcher_with_several_logs_keeps_watching(tmp_path: Path) -> None:
    """A --pid without RANK in its environment attaches to no rank: that is no reason to stop."""
    for r in range(2):
        (tmp_path / f"rank-{r}.log").write_text("")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                               env={k: v for k, v in os.environ.items() if k != "RANK"})  # fmt: skip
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "watch", "--config", str(_config(tmp_path)),
         "--pid", str(sleeper.pid),
         "--log", str(tmp_path / "rank-0.log"), "--log", str(tmp_path / "rank-1.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(3.0)
        assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
    finally:
        for p in (agent, sleeper):
            p.terminate()
            p.wait(10)


@pytest.mark.unit
def test_a_restarted_rank_gets_the_startup_grace_again() -> None:
    """Re-attached to a new pid (torchrun restart, requeue), the rank reloads its model: the
    stall timeout must be the startup grace again, not the old one-minute timeout."""
    from rankwatch.config.schema import Config
    from rankwatch.events import Progress
    from rankwatch.identity import Identity
    from rankwatch.runtime.watcher import RankWatcher

    t = [1000.0]
    ident = Identity(rank=0, local_rank=0, world_size=1, node="n", run="t")
    w = RankWatcher(Config(), ident, [], emit=lambda f: None, clock=lambda: t[0], wall=lambda: 1.7e9)
    w.attach(os.getpid())
    for i in range(50):
        t[0] += 2.0
        w.push(Progress(t[0], i))
    assert w.liveness().timeout == 60.0
    w.attach(os.getpid())  # the same process again: nothing changes
    assert w.liveness().timeout == 60.0
    w.attach(os.getppid())
    assert w.liveness().timeout == float(Config().stall.startup_grace)


@pytest.mark.process
def test_watch_several_pids_without_logs_watches_each_rank(tmp_path: Path) -> None:
    """`watch --pid A --pid B` and no --log: each pid is its own rank (from its environment),
    followed through its stdout file; not just the first pid."""
    procs = []
    for r in range(2):
        out = tmp_path / f"out-{r}.txt"
        with open(out, "ab") as fh:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "rankwatch.demo.trainer", "--format", "kv", "--step-time", "0.05",
                 "--rank", str(r), "--world-size", "2", "--steps", "100000", "--fault", "nan@40:rank=1"],
                stdout=fh, stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1", RANK=str(r), LOCAL_RANK=str(r)),
            ))  # fmt: skip
    found = tmp_path / "f.jsonl"
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(_config(tmp_path)),
         "--pid", str(procs[0].pid), "--pid", str(procs[1].pid), "--findings-jsonl", str(found)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert _wait(lambda: any(f["kind"] == "nan_loss" for f in _findings(found))), _findings(found)
        assert {f["rank"] for f in _findings(found) if f["kind"] == "nan_loss"} == {1}
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=20)
        assert "rank 0: pid" in err and "rank 1: pid" in err, err[-3000:]
    finally:
        _reap(*procs, agent)


@pytest.mark.process
def test_one_log_for_several_pids_is_a_usage_error(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "watch", "--config", str(_config(tmp_path)),
         "--pid", str(os.getpid()), "--pid", str(os.getppid()), "--log", str(tmp_path / "x.log")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 2 and "one --log for several --pid" in out.stderr


@pytest.mark.process
def test_watch_one_pid_without_log_follows_its_output_file(tmp_path: Path) -> None:
    """`watch --pid P` and no --log, P's stdout a file (`python train.py > out.txt`): the agent
    follows that file (the NaN at its step is found) and says so in its log."""
    out = tmp_path / "out.txt"
    trainer = _trainer(out, "12", "--steps", "100000", "--fault", "nan@40")
    found = tmp_path / "f.jsonl"
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(_config(tmp_path)),
         "--pid", str(trainer.pid), "--findings-jsonl", str(found)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert _wait(lambda: any(f["kind"] == "nan_loss" for f in _findings(found))), _findings(found)
        nan = next(f for f in _findings(found) if f["kind"] == "nan_loss")
        assert nan["step"] == 40 and nan["path"] == str(out), nan
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=20)
        assert f"pid {trainer.pid}: no --log given: following its output in {out}" in err, err[-3000:]
    finally:
        _reap(agent, trainer)


@pytest.mark.process
def test_watch_one_pid_whose_output_is_a_pipe_says_no_log_is_followed(tmp_path: Path) -> None:
    """P's stdout and stderr are a pipe: nothing to follow, and the agent's log says why; once P
    is gone the agent is done."""
    trainer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    err = tmp_path / "agent.err"
    with open(err, "wb") as fh:
        agent = subprocess.Popen(
            [sys.executable, "-m", "rankwatch", "watch", "--config", str(_config(tmp_path)),
             "--pid", str(trainer.pid)],
            stdout=subprocess.DEVNULL, stderr=fh,
        )  # fmt: skip
    said = f"pid {trainer.pid}: its stdout is a FIFO; its stderr is a FIFO: no log followed"
    try:
        assert _wait(lambda: said in err.read_text()), err.read_text()[-3000:]
        trainer.kill()
        trainer.wait(10)
        assert agent.wait(timeout=30) == 0
    finally:
        _reap(agent, trainer)


@pytest.mark.process
def test_a_process_output_file_is_followed_only_when_it_is_safe(tmp_path: Path) -> None:
    """What ``watch --pid`` may follow of a process's output: its own regular file under that
    name (where a rename took it); not a deleted file whose name is now a symlink, or another
    user's file."""
    from rankwatch.runtime.workers import checked_output_files

    def sleeper(out: Path) -> subprocess.Popen:
        with open(out, "ab") as fh:
            return subprocess.Popen(["sleep", "60"], stdout=fh, stderr=subprocess.DEVNULL)

    procs = []
    try:
        good = tmp_path / "good.log"
        procs.append(sleeper(good))
        assert checked_output_files(procs[-1].pid) == ([good], ["its stderr is a character device"])

        swapped = tmp_path / "swapped.log"
        procs.append(sleeper(swapped))
        swapped.rename(tmp_path / "old.log")  # rotated: the process writes on under the new name
        swapped.write_text("another file\n")
        files, _ = checked_output_files(procs[-1].pid)
        assert files == [tmp_path / "old.log"], files

        linked = tmp_path / "linked.log"
        procs.append(sleeper(linked))
        linked.unlink()
        linked.symlink_to("/etc/passwd")
        files, why = checked_output_files(procs[-1].pid)
        assert files == [] and "no longer under a name" in why[0], why

        if os.geteuid() == 0:
            theirs = tmp_path / "theirs.log"
            procs.append(sleeper(theirs))
            os.chown(theirs, 65534, 65534)
            files, why = checked_output_files(procs[-1].pid)
            assert files == [] and "owned by UID 65534" in why[0], why

        # The agent's own output file (one shell's `> job.log` for both, srun --overlap into the
        # job's slurm-N.out): never read back as the rank's log.
        ours = tmp_path / "ours.log"
        procs.append(sleeper(ours))
        saved = os.dup(2)
        try:
            with open(ours, "ab") as fh:
                os.dup2(fh.fileno(), 2)
            files, why = checked_output_files(procs[-1].pid)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        assert files == [] and "where this agent's own output goes" in why[0], why
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


@pytest.mark.process
def test_watch_match_tells_systemd_it_is_ready_once_it_watches_the_ranks(tmp_path: Path) -> None:
    """Under ``Type=notify`` (systemd/rankwatch.service) the node daemon sends ``READY=1`` once
    its first look is done: a rank already running is attached by then, so a job started after
    ``systemctl start`` returns has every step line read as it comes."""
    import socket

    marker = "77003"
    out = tmp_path / "out-0.txt"
    trainer = _trainer(out, marker, "--rank", "0", "--steps", "100000")
    addr = Path(tempfile.mkdtemp(prefix="rw-notify-")) / "notify"  # sun_path holds 108 bytes
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(addr))
    sock.settimeout(30)
    agent = None
    try:
        agent = subprocess.Popen(
            [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(_config(tmp_path)),
             "--match", f"--seed {marker}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=dict(os.environ, NOTIFY_SOCKET=str(addr)),
        )  # fmt: skip
        assert sock.recv(4096) == b"READY=1"
        assert agent.stderr is not None
        os.set_blocking(agent.stderr.fileno(), False)
        said = agent.stderr.read() or b""  # what it logged before it said so
        assert f"rank 0: pid {trainer.pid}".encode() in said, said[-3000:]
    finally:
        sock.close()
        addr.unlink(missing_ok=True)
        addr.parent.rmdir()
        _reap(agent, trainer)


@pytest.mark.unit
def test_readiness_never_fails_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NOTIFY_SOCKET nobody listens on is logged, not raised: the agent watches on."""
    from rankwatch.runtime.modes import notify_ready

    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody"))
    notify_ready()
    monkeypatch.delenv("NOTIFY_SOCKET")
    notify_ready()


@pytest.mark.unit
def test_watch_logs_of_torchrun_worker_folders_are_one_pipeline_per_worker(tmp_path: Path) -> None:
    """``watch --log`` over torchrun's ``--redirects 3 --log-dir`` files numbers them as analyze
    does (``sources/logfiles.py``): each worker folder is one rank, its stdout.log and stderr.log
    one pipeline (as under ``run -- torchrun``), not four ranks by position."""
    from rankwatch.config.schema import Config
    from rankwatch.config.snapshot import replaced
    from rankwatch.identity import Identity
    from rankwatch.runtime.agent import Agent
    from rankwatch.runtime.modes import _ProcessWatch

    root = Path(__file__).resolve().parent / "data" / "torchrun" / "redirects_oom"
    logs = sorted(root.glob("*/attempt_0/*/*.log"))
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    ident = Identity(run="t", rank=None, local_rank=None, world_size=2, node="n")
    watch = _ProcessWatch(cfg, ident, Agent(cfg, ident), pids=[], match=None, logs=logs)
    got = [(w.rank, w.identity.local_rank, sorted(s.path.name for s in w.streams)) for w in watch.watchers]
    assert got == [(0, 0, ["stderr.log", "stdout.log"]), (1, 1, ["stderr.log", "stdout.log"])]


@pytest.mark.unit
def test_a_restarted_worker_has_no_step_until_it_logs_one() -> None:
    """torchrun ``--redirects 3 --max-restarts 1`` (a real run): rank 1 SIGKILLed after step 9 in
    attempt 0; its attempt-1 worker fails in ``init_process_group``. As the launcher's pipeline
    does it (runtime/workers.py ``Fleet._add``): the old worker's end judged, its new files
    followed, the new pid attached. The new worker's failure is no "after step 9": it never
    reached a step, and what it logs from step 1 on is progress again."""
    from rankwatch.config.schema import Config
    from rankwatch.identity import Identity
    from rankwatch.records import Finding, StepRecord
    from rankwatch.runtime.watcher import RankWatcher

    run = next((Path(__file__).resolve().parent / "data" / "torchrun" / "restart_init_failure").iterdir())
    old = [run / "attempt_0" / "1" / "stdout.log", run / "attempt_0" / "1" / "stderr.log"]
    new = [run / "attempt_1" / "1" / "stdout.log", run / "attempt_1" / "1" / "stderr.log"]
    found: list[Finding] = []
    t = [1000.0]
    ident = Identity(rank=1, local_rank=1, world_size=2, node="n", run="t")
    w = RankWatcher(Config(), ident, old, emit=found.append, clock=lambda: t[0], wall=lambda: 1.7e9 + t[0])
    w.attach(os.getpid())
    killed = w.on_exit(None, signal.SIGKILL)
    assert killed is not None and "killed by signal 9 (SIGKILL) after step 9" in killed.message
    w.follow_instead(old, new)
    w.attach(os.getppid())
    assert w.engine.state.last_step is None
    t[0] += 10.0
    failed = w.on_exit(1, None)
    assert failed is not None and failed.kind == "crash", found
    assert failed.message.startswith("process exited with code 1."), failed.message
    assert "Gloo connectFullMesh failed" in failed.message and failed.step is None
    w.attach(os.getpid())  # a third worker, that trains from step 1 again
    w.push(StepRecord(step=1, loss=4.4, time=1.7e9 + t[0]))
    assert w.engine.state.last_step == 1 and w.engine.state.last_progress_time == 1.7e9 + t[0]


@pytest.mark.process
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["TERM", "INT", "HUP"])
def test_a_stop_signal_or_a_hangup_ends_watch_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    """A terminal that closes hangs up on the `watch` it started: like SIGTERM and Ctrl-C, the
    hangup ends the agent with status 0 and its --sd-file removed (a killed agent would leave
    Prometheus a target that no longer answers)."""
    log, found, sd = tmp_path / "rank0.log", tmp_path / "f.jsonl", tmp_path / "sd.json"
    log.write_text("step=1 loss=2.5\n")
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "watch", "--config", str(_config(tmp_path)), "--log", str(log),
         "--findings-jsonl", str(found), "--sd-file", str(sd)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert _wait(sd.exists, 60), "the agent never wrote its --sd-file"
        with log.open("a") as fh:
            fh.write("step=2 loss=nan\n")
        assert _wait(lambda: any(f["kind"] == "nan_loss" for f in _findings(found)), 30), _findings(found)
        agent.send_signal(sig)
        _, err = agent.communicate(timeout=30)
        assert agent.returncode == 0, err[-2000:]
        assert not sd.exists() and "Traceback" not in err, err[-2000:]
    finally:
        _reap(agent)
