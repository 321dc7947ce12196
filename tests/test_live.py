"""The live agent end to end: `rankwatch run` around the fake trainer, real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faultlib import stop_processes
from rankwatch.config.snapshot import replaced
from rankwatch.dumps.store import DumpStore, IncidentInfo

TRAINER = [sys.executable, "-m", "rankwatch.demo.trainer"]


def write_config(tmp: Path, extra: str = "") -> Path:
    cfg = tmp / "rw.yaml"
    cfg.write_text(
        f"""\
run: {{name: t}}
detectors: {{warmup_steps: 5}}
stall: {{startup_grace: 20s, floor: 2s, factor: 10}}
process: {{sample_interval: 200ms}}
dumps: {{dir: {tmp / "dumps"}}}
runner: {{log_dir: {tmp / "logs"}, term_grace: 3s}}
server: {{listen: "127.0.0.1:0"}}
{extra}"""
    )
    return cfg


def agent_cmd(cfg: Path, tmp: Path, rank: int, *trainer_args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rankwatch",
        "run",
        "--config",
        str(cfg),
        "--findings-jsonl",
        str(tmp / f"findings-{rank}.jsonl"),
        "--",
        *TRAINER,
        "--rank",
        str(rank),
        "--step-time",
        "0.01",
        *trainer_args,
    ]


def findings(tmp: Path, rank: int) -> list[dict]:
    p = tmp / f"findings-{rank}.jsonl"
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def start_two_ranks(cfg: Path, tmp: Path, *trainer_args: str) -> list[subprocess.Popen[str]]:
    """Two run-mode agents, one per rank of a two-rank fake job synchronised through a folder."""
    sync = tmp / "sync"
    sync.mkdir()
    procs = []
    for r in range(2):
        args = ["--world-size", "2", "--sync-dir", str(sync), "--steps", "100000", *trainer_args]
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2")
        cmd = agent_cmd(cfg, tmp, r, *args)
        out = subprocess.DEVNULL
        procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.PIPE, text=True))
    return procs


def two_rank_stall(store: DumpStore, timeout: float = 60.0) -> IncidentInfo | None:
    """The first stall incident that holds both ranks' stacks, within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = [i for i in store.list_incidents() if i.reason == "stall" and len(i.ranks) == 2]
        if done:
            return done[0]
        time.sleep(0.2)
    return None


def dumps_diff(tmp: Path, incident: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "dumps", "diff", incident, "--dir", str(tmp / "dumps")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout


def run_agent(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ, RANK="0")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.process
def test_nan_is_reported_and_exit_status_is_the_childs(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    out = run_agent(agent_cmd(cfg, tmp_path, 0, "--steps", "60", "--fault", "nan@30", "--format", "nanogpt"))
    assert out.returncode == 0, out.stderr
    nan = [f for f in findings(tmp_path, 0) if f["kind"] == "nan_loss" and not f["resolved"]]
    assert len(nan) == 1 and nan[0]["step"] == 30 and nan[0]["run"] == "t"
    assert "nan_loss step 30" in out.stderr
    # The child's output is echoed and is complete in the log file.
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "iter 59:" in log and "iter 59:" in out.stdout


@pytest.mark.process
def test_crash_with_traceback_is_classified(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    out = run_agent(agent_cmd(cfg, tmp_path, 0, "--steps", "50", "--fault", "crash@20"))
    assert out.returncode == 1
    found = findings(tmp_path, 0)
    # One finding per death: the CUDA error, the moment it is printed, with its traceback; the
    # exit is the record of how the process ended, tied to it (not a second critical finding).
    [error] = [f for f in found if f["severity"] == "critical"]
    assert error["kind"] == "cuda_error" and "illegal memory access" in error["message"]
    assert any("Traceback" in line for line in error["evidence"]["lines"])
    [end] = [f for f in found if f["kind"] == "process_exit"]
    ev = end["evidence"]
    assert ev["exit_code"] == 1 and ev["cause_kind"] == "cuda_error" and ev["cause_reported"] is True
    assert end["message"].startswith("process exited with code 1 after step ")


@pytest.mark.process
def test_sigkill_of_child_is_a_crash_with_exit_137(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    out = run_agent(agent_cmd(cfg, tmp_path, 0, "--steps", "50", "--fault", "kill@15"))
    assert out.returncode == 137
    crash = [f for f in findings(tmp_path, 0) if f["kind"] == "crash"]
    assert len(crash) == 1 and crash[0]["evidence"]["signal"] == 9
    assert "SIGKILL" in crash[0]["message"]


@pytest.mark.process
def test_sigterm_is_forwarded(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    p = subprocess.Popen(
        agent_cmd(cfg, tmp_path, 0, "--steps", "100000"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, RANK="0"),
    )
    try:
        log = tmp_path / "logs" / "rank-0.log"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "iteration" not in (log.read_text() if log.exists() else ""):
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 143
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.process
def test_sigterm_grace_then_sigkill_takes_the_childs_whole_process_group(tmp_path: Path) -> None:
    """A child that ignores SIGTERM and has a worker of its own: after runner.term_grace both
    are SIGKILLed, so nothing of the rank outlives the agent's step."""
    cfg = write_config(tmp_path, "")
    pidfile = tmp_path / "worker.pid"
    script = (
        "import os, signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(w.pid))\n"
        "print('iteration 1/ 10 | lm loss: 1.0E+00 |', flush=True)\n"
        "time.sleep(600)\n"
    )
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--", sys.executable, "-c", script]
    p = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ, RANK="0")
    )
    worker = None
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (pidfile.exists() and pidfile.read_text()):
            time.sleep(0.05)
        worker = int(pidfile.read_text())
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 137
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(worker):
            time.sleep(0.05)
        assert not _alive(worker), "the child's own worker outlived the SIGKILL"
        assert "SIGKILL to its process group" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
        if worker is not None and _alive(worker):
            os.kill(worker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.process
def test_step_wide_sigterm_is_a_requested_stop_not_a_crash(tmp_path: Path) -> None:
    """Slurm's scancel and time limit signal every process of a step at once: the child may be
    dead before the agent's own SIGTERM is handled. That must still read as a requested stop."""
    import psutil

    cfg = write_config(tmp_path)
    jsonl = tmp_path / "findings.jsonl"
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--findings-jsonl", str(jsonl)]
    cmd += ["--", sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ, RANK="0")
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"up"
        (child,) = psutil.Process(p.pid).children()
        child.send_signal(signal.SIGTERM)  # the worst order: the child is gone first
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.001)
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 143
    finally:
        if p.poll() is None:
            p.kill()
    got = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
    assert [f["kind"] for f in got if f["kind"] in ("crash", "process_exit")] == ["process_exit"], got


@pytest.mark.unit
def test_stall_finding_says_when_dumps_are_off(tmp_path: Path) -> None:
    from rankwatch.config.schema import Config
    from rankwatch.identity import Identity
    from rankwatch.records import Finding, Severity
    from rankwatch.runtime.agent import Agent

    cfg = replaced(Config(), {"dumps.on_stall": False, "dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, Identity(run="r", rank=0, local_rank=0, world_size=1, node="n"))
    msg = "no progress for 61s; process alive, idle. Judged from: step lines."
    agent.emit(Finding("stall", Severity.CRITICAL, 0, msg))
    (f,) = agent.findings
    assert "Stacks are being captured" not in f.message and "Stack dumps are off" in f.message
    assert (
        f.diagnosis is not None
        and f.diagnosis.dumps is not None
        and f.diagnosis.dumps.state == "off"
        and not (tmp_path / "dumps").exists()
    )


@pytest.mark.process
def test_agent_killed_with_sigkill_leaves_child_running_and_log_complete(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    p = subprocess.Popen(
        agent_cmd(cfg, tmp_path, 0, "--steps", "150", "--format", "kv"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, RANK="0"),
    )
    log = tmp_path / "logs" / "rank-0.log"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "step=5 " not in (log.read_text() if log.exists() else ""):
            time.sleep(0.05)
        p.kill()
        p.wait(timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "step=150 " not in log.read_text():
            time.sleep(0.1)
        text = log.read_text()
        steps = [int(x.split("step=")[1].split()[0]) for x in text.splitlines() if x.startswith("step=")]
        assert steps == list(range(1, 151))
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.tool
def test_two_rank_hang_dumps_and_diff_names_the_hung_rank(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    procs = start_two_ranks(cfg, tmp_path, "--fault", "hang@40:rank=1")
    try:
        incident = two_rank_stall(DumpStore(tmp_path / "dumps"))
        assert incident is not None, [f["kind"] for r in (0, 1) for f in findings(tmp_path, r)]
        # A stall finding goes out once its incident's stacks are in (it names the suspect).
        deadline = time.monotonic() + 30
        stalls: dict[int, list[dict]] = {}
        while time.monotonic() < deadline and not (stalls.get(0) and stalls.get(1)):
            time.sleep(0.2)
            stalls = {r: [f for f in findings(tmp_path, r) if f["kind"] == "stall"] for r in (0, 1)}
        assert stalls[0] and stalls[1]
        assert stalls[0][0]["step"] == 39
        assert "suspect: rank 1" in stalls[0][0]["message"], stalls[0][0]["message"]
        r0 = (incident.path / "rank-0.txt").read_text()
        r1 = (incident.path / "rank-1.txt").read_text()
        assert "all_reduce" in r0 and "wait_for_batch" in r1
        out = dumps_diff(tmp_path, incident.name)
        assert "suspect: rank 1" in out, out
    finally:
        stop_processes(procs)


@pytest.mark.tool
def test_silent_rank_joins_the_incident_its_logging_peer_opened(tmp_path: Path) -> None:
    """Megatron-style logging: only the last rank prints steps. Rank 0 hangs in its data
    loader; rank 1 (the logger) waits in all_reduce and is flagged after the floor. Rank 0's
    agent, whose own silent-rank timeout is minutes away, adds its stack to that incident, so
    the alert's folder holds both ranks and `dumps diff` names rank 0."""
    cfg = write_config(tmp_path)
    text = cfg.read_text().replace("factor: 10}", "factor: 10, silent_rank_timeout: 10m}", 1)
    cfg.write_text(text.replace("dumps: {dir:", "dumps: {join_peers: 500ms, dir:"))
    procs = start_two_ranks(cfg, tmp_path, "--no-all-ranks-log", "--fault", "hang@40:rank=0")
    try:
        store = DumpStore(tmp_path / "dumps")
        incident = two_rank_stall(store)
        assert incident is not None, [(i.name, i.ranks) for i in store.list_incidents()]
        assert len(store.list_incidents()) == 1
        assert [f["kind"] for f in findings(tmp_path, 0) if f["kind"] == "stall"] == []  # not yet its own
        assert "wait_for_batch" in (incident.path / "rank-0.txt").read_text()
        out = dumps_diff(tmp_path, incident.name)
        assert "suspect: rank 0" in out, out
    finally:
        stop_processes(procs)


@pytest.mark.process
@pytest.mark.parametrize("bad", [["run"], ["run", "--"]])
def test_run_without_command_is_usage_error(bad: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", *bad], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 2 and "no command" in out.stderr


@pytest.mark.process
def test_missing_executable_is_127(tmp_path: Path) -> None:
    cfg = write_config(tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 127 and "cannot start" in out.stderr


@pytest.mark.process
def test_agent_yields_the_cpu_but_the_child_keeps_its_priority(tmp_path: Path) -> None:
    import psutil

    cfg = write_config(tmp_path)
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--"]
    cmd += [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"]
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ, RANK="0")
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == b"up"
        agent = psutil.Process(p.pid)
        (child,) = agent.children()
        base = psutil.Process().nice()
        assert child.nice() == base
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and agent.nice() != base + 10:
            time.sleep(0.05)
        assert agent.nice() == min(19, base + 10)
        assert all(psutil.Process(t.id).nice() == agent.nice() for t in agent.threads())
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)


FAKE_FR_CHILD = r"""
import os, sys, threading, time
stem = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]
assert os.environ["TORCH_FR_DEBUG_INFO_PIPE_FILE"] == stem
assert int(os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
trace = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + "0"
with open(trace, "wb") as f:
    f.write(b"stale trace of an earlier stall")
pipe = stem + "0.pipe"
os.mkfifo(pipe)  # what ProcessGroupNCCL's DumpPipe does when the trace buffer is on

def serve():
    fd = os.open(pipe, os.O_RDONLY)
    while True:
        if os.read(fd, 64):
            time.sleep(0.05)
            with open(trace + ".tmp", "wb") as f:
                f.write(b"FLIGHT-RECORDER-TRACE")
            os.replace(trace + ".tmp", trace)
            return
        time.sleep(0.05)

threading.Thread(target=serve, daemon=True).start()
for i in range(1, 31):
    print(f" iteration {i:>8}/     100 | lm loss: 2.5 | grad norm: 0.5 |", flush=True)
    time.sleep(0.05)
time.sleep(60)
"""


@pytest.mark.tool
def test_stall_collects_the_flight_recorder_trace_through_its_pipe(tmp_path: Path) -> None:
    """A stand-in for PyTorch's DumpPipe: the agent writes to it, the new trace lands in the incident."""
    cfg = write_config(tmp_path, "")
    cfg.write_text(cfg.read_text().replace("floor: 2s", "floor: 1s"))
    child = tmp_path / "child.py"
    child.write_text(FAKE_FR_CHILD)
    env = {k: v for k, v in os.environ.items() if "DEBUG_INFO" not in k and "TRACE_BUFFER" not in k}
    p = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--", sys.executable, str(child)],
        env=dict(env, RANK="0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 40
        got: list[Path] = []
        while time.monotonic() < deadline and not got:
            got = list((tmp_path / "dumps").glob("t/*_stall/flight-recorder-rank-0.pkl"))
            time.sleep(0.2)
        assert got, "no flight recorder trace in the incident"
        assert got[0].read_bytes() == b"FLIGHT-RECORDER-TRACE"
        state = Path(__import__("tempfile").gettempdir()) / f"rankwatch-{p.pid}"
        assert state.is_dir()
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=20)
        assert not state.exists(), "run mode leaves its flight-recorder folder behind"
    finally:
        if p.poll() is None:
            p.kill()


def _run_script(tmp_path: Path, script: str) -> tuple[int, list[dict]]:
    cfg = write_config(tmp_path)
    child = tmp_path / "child.py"
    child.write_text(script)
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--findings-jsonl",
           str(tmp_path / "findings-0.jsonl"), "--", sys.executable, str(child)]  # fmt: skip
    out = run_agent(cmd)
    return out.returncode, findings(tmp_path, 0)


@pytest.mark.process
def test_plain_exception_is_one_crash_with_the_exit_code(tmp_path: Path) -> None:
    """The traceback in the log and the exit are one event: one crash, carrying both."""
    rc, found = _run_script(
        tmp_path,
        "import time\n"
        "for i in range(1, 6):\n"
        "    print(f'iteration {i:>8}/     100 | lm loss: 2.5 |', flush=True); time.sleep(0.05)\n"
        "raise ValueError('bad batch shape')\n",
    )
    assert rc == 1
    crashes = [f for f in found if f["kind"] == "crash"]
    assert len(crashes) == 1, crashes
    assert crashes[0]["evidence"]["exit_code"] == 1
    assert "ValueError: bad batch shape" in crashes[0]["message"]
    assert not [f for f in found if f["kind"] == "traceback"]


@pytest.mark.process
def test_handled_traceback_of_a_live_process_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    rc, found = _run_script(
        tmp_path,
        "import time, traceback\n"
        "try:\n"
        "    raise KeyError('tokenizer cache')\n"
        "except KeyError:\n"
        "    traceback.print_exc()\n"
        "for i in range(1, 6):\n"
        "    print(f'iteration {i:>8}/     100 | lm loss: 2.5 |', flush=True); time.sleep(0.05)\n",
    )
    assert rc == 0
    assert not [f for f in found if f["kind"] == "crash"], found
    (tb,) = [f for f in found if f["kind"] == "traceback"]
    assert tb["severity"] == "warning" and "exited cleanly" in tb["message"]


@pytest.mark.unit
def test_traceback_of_a_process_still_running_becomes_a_warning_after_the_hold() -> None:
    from faultlib import IDENT, FakeClock
    from rankwatch.config.schema import Config
    from rankwatch.records import ErrorRecord, Severity
    from rankwatch.runtime import watcher as wmod

    clock = FakeClock(100.0)
    found: list = []
    w = wmod.RankWatcher(Config(), IDENT, [], emit=found.append, clock=clock, wall=lambda: 1.7e9)
    w.prober = object()  # type: ignore[assignment]  # a live process is attached
    tb = ["Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'cache'"]
    w._records([ErrorRecord(kind="crash", severity=Severity.CRITICAL, summary="KeyError: 'cache'",
                            evidence=tb, rank=0, line=3)])  # fmt: skip
    assert found == []
    clock.advance(wmod.CRASH_HOLD_S - 1)
    w.release_held()
    assert found == []
    clock.advance(2)
    w.release_held()
    (f,) = found
    assert f.kind == "traceback" and f.severity is Severity.WARNING
    assert "still running 16s later" in f.message


@pytest.mark.unit
def test_launcher_death_lines_are_not_held_and_a_stopping_agent_loses_nothing_held() -> None:
    from faultlib import IDENT, FakeClock
    from rankwatch.config.schema import Config
    from rankwatch.records import ErrorRecord, Severity
    from rankwatch.runtime import watcher as wmod

    clock = FakeClock(100.0)
    found: list = []
    w = wmod.RankWatcher(Config(), IDENT, [], emit=found.append, clock=clock, wall=lambda: 1.7e9)
    w.prober = object()  # type: ignore[assignment]
    elastic = ["E0101 api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 1234) of binary: python3"]
    w._records([ErrorRecord(kind="crash", severity=Severity.CRITICAL, summary="worker failed",
                            evidence=elastic, rank=0, line=1)])  # fmt: skip
    assert [f.kind for f in found] == ["crash"]  # a death already happened: out at once
    tb = ["Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'cache'"]
    w._records([ErrorRecord(kind="crash", severity=Severity.CRITICAL, summary="KeyError",
                            evidence=tb, rank=0, line=5)])  # fmt: skip
    assert len(found) == 1
    w.flush_held()  # the agent stops (SIGTERM) inside the hold: the traceback still goes out
    assert [f.kind for f in found] == ["crash", "traceback"]
