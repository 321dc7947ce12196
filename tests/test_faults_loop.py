"""Nothing the job does blocks or starves the agent's loop: an undrained stdout, a burst of
log lines, CR-only progress floods. Real ``rankwatch run`` processes; waits are bounded polls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from faultlib import free_port, metric, stop_processes, until, wait_for
from rankwatch.runtime.loopmon import LoopMonitor
from rankwatch.runtime.watcher import _latest_redraws
from rankwatch.sources.lines import FollowedLine
from rankwatch.sources.logparser import ParseStats

pytestmark = pytest.mark.faults

# Filler, then 20 kv step lines with a NaN at step 15, then waits for the done file.
CHILD = r"""
import os, sys, time
fill, line_bytes, done, pidfile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
open(pidfile, "w").write(str(os.getpid()))
line = b"data: fetched a batch of 64 samples from shard 3 of 17 " + b"x" * max(0, line_bytes - 57) + b"\n"
n = max(1, fill // len(line))
half = n // 2
for s in range(1, 11):
    os.write(1, b"step=%d loss=%.3f lr=1e-4\n" % (s, 2 + 1 / s))
for i in range(0, n, 1000):
    os.write(1, line * min(1000, n - i))
    if i <= half < i + 1000:
        for s in range(11, 21):
            os.write(1, b"step=%d loss=%s lr=1e-4\n" % (s, b"nan" if s == 15 else b"%.3f" % (2 + 1 / s)))
while not os.path.exists(done):
    time.sleep(0.05)
"""


def _config(tmp: Path, port: int) -> Path:
    cfg = tmp / "rw.yaml"
    cfg.write_text(
        f"""\
run: {{name: loop, rank: 0}}
logs: {{format: kv, poll_interval: 100ms}}
detectors: {{warmup_steps: 5}}
process: {{sample_interval: 200ms}}
dumps: {{dir: {tmp / "dumps"}}}
runner: {{log_dir: {tmp / "logs"}, term_grace: 3s}}
server: {{listen: "127.0.0.1:{port}"}}
gpu: {{enabled: false}}
alerts: {{spool_dir: {tmp / "spool"}}}
"""
    )
    return cfg


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _findings(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


class _Probe(threading.Thread):
    """/healthz every 100 ms; each answer must come within ``limit`` seconds."""

    def __init__(self, port: int, limit: float) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/healthz"
        self.limit = limit
        self.answered = 0
        self.missed: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t = time.monotonic()
            try:
                status, _ = _get(self.url, self.limit)
                self.answered += 1
                if status != 200:
                    self.missed.append(f"status {status}")
            except OSError as e:
                self.missed.append(f"{e} after {time.monotonic() - t:.1f}s")
            self.halt.wait(0.1)


def _start(tmp: Path, stdout: int, fill: int, line_bytes: int) -> tuple[subprocess.Popen, int, Path]:
    port = free_port()
    cfg = _config(tmp, port)
    child = tmp / "child.py"
    child.write_text(CHILD)
    cmd = [
        sys.executable, "-m", "rankwatch", "run", "--config", str(cfg),
        "--findings-jsonl", str(tmp / "findings.jsonl"), "--",
        sys.executable, str(child), str(fill), str(line_bytes), str(tmp / "done"), str(tmp / "child.pid"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID", "LOCAL_RANK")}
    p = subprocess.Popen(
        cmd,
        stdout=stdout,
        stderr=open(tmp / "agent.err", "wb"),  # noqa: SIM115
        stdin=subprocess.DEVNULL,
        env=env,
    )
    return p, port, tmp / "findings.jsonl"


def _stop(p: subprocess.Popen, tmp: Path) -> None:
    """The agent, then the child if a failed test left it blocked on its pipe (never outlive the test)."""
    stop_processes([p])
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((tmp / "child.pid").read_text()), signal.SIGKILL)


def _dropped(port: int) -> float:
    text = _get(f"http://127.0.0.1:{port}/metrics")[1]
    return metric(text, "rankwatch_echo_dropped_bytes_total") or 0.0


def _serving(p: subprocess.Popen, port: int, tmp: Path) -> None:
    def up() -> bool:
        assert p.poll() is None, (tmp / "agent.err").read_text()[-3000:]
        with contextlib.suppress(OSError):
            return _get(f"http://127.0.0.1:{port}/metrics", 2.0)[0] == 200
        return False

    assert wait_for(up, 60), "agent did not serve"


@pytest.mark.process
def test_stdout_nobody_reads_does_not_freeze_the_agent(tmp_path: Path) -> None:
    """The agent's stdout is a pipe nobody reads: the child fills it (and 12 MiB more), then
    logs a NaN. /healthz answers throughout, the NaN is found, the echo drops and counts, and
    the child runs on untouched and its exit status is the agent's."""
    r, w = os.pipe()  # the read end stays open and unread: writes block, never EPIPE
    try:
        p, port, found = _start(tmp_path, w, 12 << 20, 1000)
        os.close(w)
        try:
            _serving(p, port, tmp_path)
            probe = _Probe(port, 5.0)
            probe.start()
            assert wait_for(lambda: any(f["kind"] == "nan_loss" for f in _findings(found)), 90)
            assert wait_for(
                lambda: (
                    (
                        metric(
                            _get(f"http://127.0.0.1:{port}/metrics")[1], "rankwatch_echo_dropped_bytes_total"
                        )
                        or 0
                    )
                    > 0
                ),
                60,
            )
            probe.halt.set()
            probe.join(10)
            assert probe.answered > 0 and not probe.missed, probe.missed[:5]
            child = int((tmp_path / "child.pid").read_text())
            os.kill(child, 0)  # still running: nothing we did touched it
            nan = next(f for f in _findings(found) if f["kind"] == "nan_loss")
            assert nan["step"] == 15
            (tmp_path / "done").touch()
            assert p.wait(60) == 0  # exits although its stdout is still full
            err = (tmp_path / "agent.err").read_text()
            assert err.count("stdout is not being read") == 1, err[-2000:]
        finally:
            _stop(p, tmp_path)
    finally:
        os.close(r)


@pytest.mark.process
def test_burst_with_slow_stdout_keeps_healthz_answering_and_finds_the_nan(tmp_path: Path) -> None:
    """300k lines at once while the agent's stdout drains at 1 MB/s (a terminal over ssh, a
    busy tee): /healthz answers every probe within 5 s and the NaN in the middle is found."""
    r, w = os.pipe()
    stop = threading.Event()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set() and os.read(r, 64 << 10):
                time.sleep(0.064)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    p, port, found = _start(tmp_path, w, 300_000 * 60, 60)
    os.close(w)
    try:
        _serving(p, port, tmp_path)
        probe = _Probe(port, 5.0)
        probe.start()
        assert wait_for(lambda: any(f["kind"] == "nan_loss" for f in _findings(found)), 120)
        probe.halt.set()
        probe.join(10)
        assert probe.answered > 0 and not probe.missed, probe.missed[:5]
        (tmp_path / "done").touch()
        assert p.wait(60) == 0
    finally:
        _stop(p, tmp_path)
        stop.set()
        os.close(r)


@pytest.mark.unit
def test_healthz_reports_a_lagging_loop() -> None:
    clock = [100.0]
    mon = LoopMonitor(interval=1.0, limit=5.0, window=30.0, clock=lambda: clock[0])
    mon.tick(100.0)
    mon.tick(101.0)
    assert mon.health() == (True, "ok")
    clock[0] = 112.0  # the tick due at 102 has not run: 10 s late now
    ok, text = mon.health()
    assert not ok and "event loop lagging" in text and "10.0s late" in text
    mon.tick(112.0)  # it ran, 10 s late: unhealthy for the window, then healthy again
    clock[0] = 113.0
    assert not mon.health()[0]
    for t in range(113, 144):
        mon.tick(float(t))
    clock[0] = 143.0
    assert mon.health()[0] and mon.lag == 0.0 and mon.max_lag == 10.0


@pytest.mark.unit
def test_progress_redraws_collapse_to_first_and_last_segment() -> None:
    bar = [
        FollowedLine(f"[rank1]: {i}%|###| {i}/100" if i == 0 else f"{i}%|###| {i}/100", 7) for i in range(100)
    ]
    err = FollowedLine("RuntimeError: CUDA error: an illegal memory access", 7)
    batch = [FollowedLine("step=1 loss=2", 6), *bar[:50], err, *bar[50:], FollowedLine("step=2 loss=2", 8)]
    stats = ParseStats()
    out = _latest_redraws(batch, stats)
    assert [fl.text for fl in out] == ["step=1 loss=2", bar[0].text, err.text, bar[99].text, "step=2 loss=2"]
    assert stats.unparsed == stats.lines == len(batch) - len(out)


@pytest.mark.unit
def test_echo_to_a_full_pipe_drops_counts_and_resumes_with_a_note(tmp_path: Path) -> None:
    from rankwatch.runtime.echo import Echo

    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    r, w = os.pipe()
    os.set_blocking(r, False)
    echo = Echo(log, 0, w, max_backlog=256 << 10, poll_s=0.01)

    def read_all() -> bytes:
        out = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(r, 1 << 16):
                out += chunk
        return out

    async def main() -> bytes:
        echo.start()
        with open(log, "ab") as fh:
            fh.write(b"a" * (1 << 20))  # the pipe (64 KiB) fills, the rest is over the backlog bound
            fh.flush()
            assert await until(lambda: echo.dropped_bytes > 0)
            got = read_all()  # the reader comes back
            fh.write(b"after\n")
        assert await until(lambda: echo.written_bytes >= len(got) + 6)
        tail = b""

        def drained() -> bool:  # what the echo wrote since the reader came back is in the pipe
            nonlocal tail
            tail += read_all()
            return tail.endswith(b"after\n")

        assert await until(drained)
        got += tail
        await asyncio.wait_for(echo.close(2.0), timeout=20)  # a close that ignores its bound hangs
        return got

    try:
        got = asyncio.run(main())
    finally:
        os.close(r)
        os.close(w)
    assert echo.dropped_bytes > 0 and echo.written_bytes + echo.dropped_bytes >= (1 << 20) + 6
    assert b"not echoed so far: our stdout was not being read" in got and got.endswith(b"after\n")


def _full_pipe() -> tuple[int, int]:
    """A pipe already full: the next blocking write to it waits for a reader that never comes."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"x" * 4096)
    os.set_blocking(w, True)
    return r, w


@pytest.mark.process
def test_stdout_and_stderr_nobody_reads_do_not_freeze_the_agent(tmp_path: Path) -> None:
    """srun's output channel stalled: both of the agent's streams are full pipes from the start.
    Its log lines and console findings go nowhere, but detection, /healthz and the exit go on."""
    r1, w1 = _full_pipe()
    r2, w2 = _full_pipe()
    port = free_port()
    cfg = _config(tmp_path, port)
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    cmd = [
        sys.executable, "-m", "rankwatch", "-v", "run", "--config", str(cfg),
        "--findings-jsonl", str(tmp_path / "findings.jsonl"), "--",
        sys.executable, str(child), "1000", "100", str(tmp_path / "done"), str(tmp_path / "child.pid"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID", "LOCAL_RANK")}
    p = subprocess.Popen(cmd, stdout=w1, stderr=w2, stdin=subprocess.DEVNULL, env=env)
    os.close(w1)
    os.close(w2)
    try:

        def up() -> bool:
            assert p.poll() is None
            with contextlib.suppress(OSError):
                return _get(f"http://127.0.0.1:{port}/healthz", 2.0) == (200, "ok\n")
            return False

        assert wait_for(up, 60), "agent did not serve"
        found = tmp_path / "findings.jsonl"
        assert wait_for(lambda: any(f["kind"] == "nan_loss" for f in _findings(found)), 60)
        assert wait_for(lambda: _stderr_dropped(port) > 0, 30)  # -v: it logs, nobody reads
        assert _get(f"http://127.0.0.1:{port}/healthz", 5.0) == (200, "ok\n")
        (tmp_path / "done").touch()
        assert p.wait(60) == 0
    finally:
        _stop(p, tmp_path)
        os.close(r1)
        os.close(r2)


def _stderr_dropped(port: int) -> float:
    text = _get(f"http://127.0.0.1:{port}/metrics")[1]
    return metric(text, "rankwatch_stderr_dropped_bytes_total") or 0.0
