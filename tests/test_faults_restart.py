"""The agent SIGKILLed mid-run and started again, as real processes: the alert spooled while
the webhook was down is delivered exactly once after the restart, and the new agent knows the
rank's step from the log without re-alerting its history. (That a killed `run` agent leaves its
rank alone is tests/test_live.py's; a watch agent has no tie to the rank to break.)"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import agent_token

pytestmark = [pytest.mark.process, pytest.mark.faults]


class Hook:
    """A webhook receiver that can be down (503) and records what it accepted."""

    def __init__(self) -> None:
        self.down = True
        self.posted: list[dict] = []
        self.refused = 0
        # ``hold``: the next POST is read and left unanswered until ``release`` is set (an
        # attempt in flight); it is not counted as delivered.
        self.hold = False
        self.held = threading.Event()
        self.release = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if hook.hold:
                    hook.hold = False
                    hook.held.set()
                    hook.release.wait(60)
                    self.close_connection = True
                    return
                if hook.down:
                    hook.refused += 1
                    self.send_response(503)
                else:
                    hook.posted.append(json.loads(body))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wait(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def _lines(first: int, last: int, loss: str = "2.5") -> str:
    """Healthy step lines; the last one carries ``loss``."""
    return "".join(
        f"step={i} loss={loss if i == last else '2.5'} lr=0.0003 grad_norm=0.4\n"
        for i in range(first, last + 1)
    )


PORT = re.compile(r"serving metrics and API on [^\s]+:(\d+)")


def _agent(cfg: Path, trainer: int, log: Path, err: Path) -> subprocess.Popen:
    with open(err, "wb") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg), "--pid", str(trainer),
             "--log", str(log), "--listen", "127.0.0.1:0"],
            stdout=subprocess.DEVNULL, stderr=fh,
        )  # fmt: skip


def _port(err: Path) -> int | None:
    m = PORT.search(err.read_text(errors="replace")) if err.exists() else None
    return int(m.group(1)) if m else None


def _status(err: Path) -> dict:
    url = f"http://127.0.0.1:{_port(err)}/api/status"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {agent_token()}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def _teardown(agents: list[subprocess.Popen], trainer: subprocess.Popen, hook: Hook) -> None:
    """Every agent still running stopped (killed past 15 s), the trainer and the hook closed."""
    for a in agents:
        if a.poll() is None:
            a.send_signal(signal.SIGTERM)
            try:
                a.wait(timeout=15)
            except subprocess.TimeoutExpired:
                a.kill()
    trainer.kill()
    trainer.wait(10)
    hook.close()


def _setup(tmp_path: Path, hook: Hook, run: str, webhook: str = "") -> tuple[Path, Path, Path]:
    """A rank log of 30 healthy steps and an agent config posting to ``hook`` with a spool:
    (log, spool, config). ``webhook``: more keys of the webhook sink."""
    log = tmp_path / "rank-0.log"
    log.write_text(_lines(1, 30))
    spool = tmp_path / "spool"
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: {run}, rank: 0}}\ndetectors: {{warmup_steps: 5}}\n"
        f"process: {{sample_interval: 200ms}}\ndumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f"gpu: {{enabled: false}}\n"
        f"alerts: {{startup_quiet: 0s, group_wait: 0s, backoff_max: 1s, spool_dir: {spool},"
        f" webhook: {{urls: ['{hook.url}']{webhook}}}}}\n"
    )
    return log, spool, cfg


def test_agent_sigkilled_and_restarted_sends_the_spooled_alert_once_and_rebuilds_from_the_log(
    tmp_path: Path,
) -> None:
    hook = Hook()
    log, _, cfg = _setup(tmp_path, hook, "restart")
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    agents: list[subprocess.Popen] = []
    try:
        err1, err2 = tmp_path / "agent1.err", tmp_path / "agent2.err"
        agents.append(_agent(cfg, trainer.pid, log, err1))
        assert _wait(lambda: _port(err1) is not None), err1.read_text()
        assert _wait(lambda: _status(err1)["ranks"][0].get("step") == 30)
        with log.open("a") as fh:
            fh.write(_lines(31, 40, loss="nan"))
        spool = tmp_path / "spool"
        assert _wait(lambda: hook.refused >= 1 and any(p.stat().st_size for p in spool.glob("*.jsonl")))

        agents[0].send_signal(signal.SIGKILL)
        agents[0].wait(timeout=10)
        hook.down = False

        agents.append(_agent(cfg, trainer.pid, log, err2))
        assert _wait(lambda: _port(err2) is not None), err2.read_text()
        assert _wait(lambda: len(hook.posted) >= 1), err2.read_text()
        # The spool is sent as soon as the agent is up; the log's history is replayed beside it
        # in bounded turns, so on a loaded machine the step shows up a moment after the alert.
        assert _wait(lambda: _status(err2)["ranks"][0].get("step") == 40), _status(err2)
        # Retries, the replayed history, a second spool pass: whatever would re-send has done so
        # once the agent has flushed and exited (SIGTERM sends or spools what is queued).
        agents[1].send_signal(signal.SIGTERM)
        assert agents[1].wait(timeout=30) == 0, err2.read_text()
        nan = [p for p in hook.posted if "nan_loss" in json.dumps(p)]
        assert len(nan) == 1, hook.posted
        assert len(hook.posted) == 1, hook.posted
        assert not any(p.stat().st_size for p in spool.glob("*.jsonl"))
    finally:
        _teardown(agents, trainer, hook)


def test_agent_sigkilled_while_an_alert_is_in_flight_the_restarted_one_delivers_it(tmp_path: Path) -> None:
    """The agent is SIGKILLed while its first attempt to post a NaN alert is in flight (the
    webhook has read the request and not answered), after its state file says the alert was
    announced: the restarted agent delivers it (from the outbox), once."""
    hook = Hook()
    hook.down, hook.hold = False, True
    log, spool, cfg = _setup(tmp_path, hook, "inflight", ", timeout: 60s")
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    agents: list[subprocess.Popen] = []
    try:
        err1, err2 = tmp_path / "agent1.err", tmp_path / "agent2.err"
        agents.append(_agent(cfg, trainer.pid, log, err1))
        assert _wait(lambda: _port(err1) is not None), err1.read_text()
        assert _wait(lambda: _status(err1)["ranks"][0].get("step") == 30)
        with log.open("a") as fh:
            fh.write(_lines(31, 40, loss="nan"))
        assert hook.held.wait(30), err1.read_text()  # the attempt is in flight
        assert _wait(lambda: '"kind":"nan_loss"' in _state(spool) and '"sent":true' in _state(spool))
        agents[0].send_signal(signal.SIGKILL)
        agents[0].wait(timeout=10)
        hook.release.set()
        assert not hook.posted

        agents.append(_agent(cfg, trainer.pid, log, err2))
        assert _wait(lambda: _port(err2) is not None), err2.read_text()
        assert _wait(lambda: len(hook.posted) >= 1), err2.read_text()
        agents[1].send_signal(signal.SIGTERM)
        assert agents[1].wait(timeout=30) == 0, err2.read_text()
        assert [p["kind"] for p in hook.posted] == ["nan_loss"], hook.posted
        assert hook.posted[0]["status"] == "firing"
    finally:
        hook.release.set()
        _teardown(agents, trainer, hook)


def _nan_alerts(hook: Hook) -> list[str]:
    return [p["status"] for p in hook.posted if p["kind"] == "nan_loss"]


def _state(spool: Path) -> str:
    return "".join(p.read_text() for p in spool.glob("*.state.json"))


def test_kill_9_and_restart_still_resolves_and_reports_a_nan_no_agent_saw_once(tmp_path: Path) -> None:
    """The agent announced a NaN and is SIGKILLed: its successor sends the resolve when the loss is
    finite again (not a second firing). Killed again, a NaN written while no agent runs is
    reported by the next one, once, and its resolve follows."""
    hook = Hook()
    hook.down = False
    log, spool, cfg = _setup(tmp_path, hook, "restart2")
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    agents: list[subprocess.Popen] = []

    def start(n: int, step: int) -> Path:
        err = tmp_path / f"agent{n}.err"
        agents.append(_agent(cfg, trainer.pid, log, err))
        assert _wait(lambda: _port(err) is not None), err.read_text()
        assert _wait(lambda: _status(err)["ranks"][0].get("step") == step), err.read_text()
        return err

    def kill9() -> None:
        agents[-1].send_signal(signal.SIGKILL)
        agents[-1].wait(timeout=10)

    try:
        start(1, 30)
        with log.open("a") as fh:
            fh.write(_lines(31, 35, loss="nan"))
        assert _wait(lambda: _nan_alerts(hook) == ["firing"])
        assert _wait(lambda: '"kind":"nan_loss"' in _state(spool) and '"sent":true' in _state(spool))
        # Acknowledged, not only posted: an alert killed in flight is sent again (at least once).
        assert _wait(lambda: not any(p.stat().st_size for p in spool.glob("*.jsonl")))
        kill9()

        err = start(2, 35)
        with log.open("a") as fh:
            fh.write(_lines(36, 45))
        assert _wait(lambda: len(_nan_alerts(hook)) >= 2), err.read_text()
        assert _nan_alerts(hook) == ["firing", "resolved"]  # FIFO: a re-sent firing would come first
        # The successor's resolve closes the firing its predecessor sent: the same id.
        fired, cleared = (p for p in hook.posted if p["kind"] == "nan_loss")
        assert cleared["id"] == fired["id"], hook.posted
        assert _wait(lambda: '"ended_step":36' in _state(spool))
        kill9()

        with log.open("a") as fh:  # while no agent runs
            fh.write(_lines(46, 50) + _lines(51, 52, loss="nan"))
        err = start(3, 52)
        assert _wait(lambda: len(_nan_alerts(hook)) >= 3), err.read_text()
        with log.open("a") as fh:
            fh.write(_lines(53, 60))
        assert _wait(lambda: len(_nan_alerts(hook)) >= 4), err.read_text()
        assert _nan_alerts(hook) == ["firing", "resolved", "firing", "resolved"]
        nan = [p for p in hook.posted if p["kind"] == "nan_loss"]
        assert nan[2]["step"] >= 51 and nan[1]["step"] >= 36  # the NaN no agent saw, and its clear
        assert trainer.poll() is None  # the rank never noticed
    finally:
        _teardown(agents, trainer, hook)
