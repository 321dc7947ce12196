"""Findings that say what really happened: a log disk that fills (warned before, named at the
death), stack dumps that could not be taken (ptrace refused by the kernel, a full dumps
folder, py-spy failing for each of its reasons), stop signals we forwarded, line numbers and
times, strict JSON. Real processes, real py-spy, real tmpfs; waits are bounded polls."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlib import IDENT, free_port, live_watch, stop_processes, until, wait_for
from rankwatch.actions.console import JsonlSink
from rankwatch.config.loader import config_from_yaml
from rankwatch.dumps.capture import capture, find_py_spy
from rankwatch.dumps.ptrace import tracer_preexec
from rankwatch.records import Finding, Severity

pytestmark = pytest.mark.faults


@contextlib.contextmanager
def _tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """A real, small filesystem that fills up; skipped where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) here")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=10)


def _fill(fs: Path) -> None:
    with open(fs / ".filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)


def _findings(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _run_cmd(tmp: Path, log_dir: Path, child: str, *args: str, extra: str = "") -> list[str]:
    cfg = tmp / "rw.yaml"
    cfg.write_text(
        f"""\
run: {{name: findings, rank: 0}}
logs: {{format: kv, poll_interval: 100ms}}
detectors: {{warmup_steps: 5}}
process: {{sample_interval: 100ms}}
dumps: {{dir: {tmp / "dumps"}}}
runner: {{log_dir: {log_dir}, term_grace: 5s}}
server: {{listen: "127.0.0.1:{free_port()}"}}
gpu: {{enabled: false}}
alerts: {{spool_dir: {tmp / "spool"}}}
{extra}"""
    )
    script = tmp / "child.py"
    script.write_text(child)
    return [
        sys.executable, "-m", "rankwatch", "run", "--config", str(cfg),
        "--findings-jsonl", str(tmp / "findings.jsonl"), "--", sys.executable, str(script), *args,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID", "LOCAL_RANK")}


# --- 8: the log disk fills -------------------------------------------------------------------
FILLER_CHILD = r"""
import sys, time
for s in range(1, 21):
    print(f"step={s} loss={2 + 1 / s:.3f} lr=1e-4")
    time.sleep(0.02)
line = "data: " + "x" * 1000
while True:  # ~100 KB/s: the agent sees the disk filling before it is full
    for _ in range(50):
        print(line)
    time.sleep(0.5)
"""


@pytest.mark.process
def test_log_disk_filling_is_warned_then_the_death_is_named_enospc(tmp_path: Path) -> None:
    with _tmpfs(tmp_path / "logs", "2m") as logs:
        out = tmp_path / "echo.out"
        with open(out, "wb") as fh:
            p = subprocess.run(
                _run_cmd(tmp_path, logs, FILLER_CHILD),
                stdout=fh,
                stderr=subprocess.PIPE,
                timeout=120,
                env=_env(),
            )
        found = _findings(tmp_path / "findings.jsonl")
        kinds = [f["kind"] for f in found]
        assert p.returncode != 0, p.stderr[-2000:]
        low = [f for f in found if f["kind"] == "disk_low" and not f["resolved"]]
        assert low, kinds
        assert "log folder" in low[0]["message"] and str(logs) in low[0]["message"]
        (crash,) = [f for f in found if f["kind"] == "crash"]
        assert found.index(low[0]) < found.index(crash)  # warned before the death
        assert "ENOSPC" in crash["message"] and "disk full" in crash["message"], crash["message"]
        assert "No error was recognised" not in crash["message"]
        assert crash["evidence"]["cause_kind"] == "disk_full"


# --- 10: stack dumps that could not be taken ---------------------------------------------------
def _stall_cfg(tmp: Path, py_spy: str, dumps: Path) -> object:
    return config_from_yaml(
        f"""\
run: {{name: faults, rank: 0}}
logs: {{format: kv, poll_interval: 50ms}}
detectors: {{warmup_steps: 5}}
stall: {{floor: 1s, factor: 2, startup_grace: 30s}}
process: {{sample_interval: 100ms}}
dumps: {{dir: {dumps}, py_spy: {py_spy}, flight_recorder: false, join_peers: 0s}}
server: {{listen: "127.0.0.1:0"}}
gpu: {{enabled: false}}
alerts: {{spool_dir: {tmp / "spool"}}}
"""
    )


def _stall(tmp: Path, py_spy: str, dumps: Path) -> Finding:
    """A real rank process whose log stops: the stall finding the agent sends."""
    log = tmp / "rank-0.log"
    log.write_bytes(b"")
    # Names this process (the agent, in-process) its ptracer, as run mode does, for Yama scope 1.
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], preexec_fn=tracer_preexec(os.getpid())
    )
    try:

        async def main() -> Finding:
            async with live_watch(_stall_cfg(tmp, py_spy, dumps), [log], pids=[rank.pid]) as live:
                for s in range(1, 12):
                    with open(log, "ab") as fh:
                        fh.write(b"step=%d loss=%.3f lr=1e-4\n" % (s, 2 + 1 / s))
                    await asyncio.sleep(0.1)
                assert await until(lambda: "stall" in live.recorder.kinds(), 30)
                return next(f for f in live.recorder.findings if f.kind == "stall" and not f.resolved)

        f = asyncio.run(main())
        assert rank.poll() is None  # the rank runs on, untouched
        return f
    finally:
        rank.kill()
        rank.wait(10)


@pytest.mark.tool
def test_stall_with_ptrace_refused_by_the_kernel_says_no_stacks(tmp_path: Path) -> None:
    real, setpriv = find_py_spy("py-spy"), shutil.which("setpriv")
    if os.geteuid() != 0:
        pytest.skip("needs root: py-spy as nobody against a root-owned rank")
    assert real and setpriv, "py-spy and setpriv are installed in CI"
    tmp_path.chmod(0o755)
    py_spy = tmp_path / "py-spy"  # the real py-spy, as nobody without CAP_SYS_PTRACE
    py_spy.write_text(f'#!/bin/sh\nexec {setpriv} --reuid=65534 --regid=65534 --clear-groups {real} "$@"\n')
    py_spy.chmod(0o755)
    f = _stall(tmp_path, str(py_spy), tmp_path / "dumps")
    assert "Stacks are being captured" not in f.message and "Stacks captured" not in f.message
    assert "no stacks were captured" in f.message and "ptrace denied" in f.message, f.message
    assert "CAP_SYS_PTRACE" in f.message
    assert f.diagnosis is not None and f.diagnosis.dumps is not None
    assert f.diagnosis.dumps.state == "failed" and f.diagnosis.dump_link is None
    assert f.time is not None and abs(f.time - time.time()) < 120


@pytest.mark.tool
def test_stall_with_the_dumps_folder_full_says_so(tmp_path: Path) -> None:
    real = find_py_spy("py-spy")
    assert real, "py-spy is installed in CI"
    with _tmpfs(tmp_path / "dumps", "1m") as dumps:
        _fill(dumps)
        f = _stall(tmp_path, real, dumps)
    assert "Stacks are being captured" not in f.message and "Stacks captured" not in f.message
    assert "no stacks were captured" in f.message and "is full" in f.message, f.message
    assert f.diagnosis is not None and f.diagnosis.dumps is not None
    assert f.diagnosis.dumps.state == "failed" and f.diagnosis.dump_link is None


@pytest.mark.tool
def test_stall_with_working_dumps_names_the_folder(tmp_path: Path) -> None:
    real = find_py_spy("py-spy")
    assert real, "py-spy is installed in CI"
    f = _stall(tmp_path, real, tmp_path / "dumps")
    assert "Stacks captured in " in f.message and "Stacks are being captured" not in f.message, f.message
    assert f.diagnosis is not None and f.diagnosis.dump_link is not None
    folder = Path(f.diagnosis.dump_link)
    assert (folder / "rank-0.txt").exists() and "FAILED" not in (folder / "rank-0.txt").read_text()[:200]


@pytest.mark.process
def test_py_spy_failures_are_named_by_their_cause(tmp_path: Path) -> None:
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        missing = capture(rank.pid, py_spy=str(tmp_path / "nope" / "py-spy"))
        assert missing.error == "py-spy not found" and "not found" in missing.text
        noexec = tmp_path / "py-spy-noexec"
        noexec.write_text("#!/bin/sh\nexit 0\n")
        noexec.chmod(0o644)
        denied = capture(rank.pid, py_spy=str(noexec))
        assert denied.error == "py-spy not runnable", denied.text
        assert "permission denied" in denied.text and "not found on PATH" not in denied.text
        slow = tmp_path / "py-spy-slow"
        slow.write_text("#!/bin/sh\nsleep 30\n")
        slow.chmod(0o755)
        t = time.monotonic()
        timed = capture(rank.pid, py_spy=str(slow), timeout=1.0)
        assert timed.error == "timeout" and "did not finish within 1s" in timed.text
        assert time.monotonic() - t < 10
        full = tmp_path / "py-spy-enospc"
        full.write_text("#!/bin/sh\necho 'Error: No space left on device (os error 28)' >&2\nexit 1\n")
        full.chmod(0o755)
        enospc = capture(rank.pid, py_spy=str(full))
        assert enospc.error == "disk full" and "ENOSPC" in enospc.text
        assert rank.poll() is None
    finally:
        rank.kill()
        rank.wait(10)


# --- 11: stop signals, line numbers, times, JSON ---------------------------------------------
SLEEPER = r"""
import os, signal, sys, time
mode = sys.argv[1]
if mode == "term-exit-3":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
for s in range(1, 8):
    print(f"step={s} loss={2 + 1 / s:.3f} lr=1e-4", flush=True)
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(120)
"""


@pytest.mark.process
@pytest.mark.parametrize(
    ("sig", "mode"),
    [(signal.SIGINT, "default"), (signal.SIGHUP, "default"), (signal.SIGTERM, "term-exit-3")],
)
def test_a_forwarded_stop_is_not_a_critical_crash(tmp_path: Path, sig: int, mode: str) -> None:
    """SIGINT (KeyboardInterrupt traceback, exit 1), SIGHUP (killed by it), or a SIGTERM
    handler exiting 3: the child did what it was told."""
    ready = tmp_path / "child.pid"
    p = subprocess.Popen(
        _run_cmd(tmp_path, tmp_path / "logs", SLEEPER, mode, str(ready)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(),
    )
    try:
        assert wait_for(lambda: ready.exists() and ready.read_text() != "", 60)
        p.send_signal(sig)
        p.wait(60)
        found = _findings(tmp_path / "findings.jsonl")
        assert [f for f in found if f["severity"] == "critical"] == [], found
        (done,) = [f for f in found if f["kind"] in ("process_exit", "crash")]
        assert done["kind"] == "process_exit" and "we forwarded" in done["message"], done
        assert signal.Signals(sig).name in done["message"]
    finally:
        stop_processes([p])


@pytest.mark.process
def test_watch_line_numbers_count_from_the_files_start(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"".join(b"step=%d loss=%.3f lr=1e-4\n" % (s, 2 + 1 / s) for s in range(1, 101)))
    cfg = _stall_cfg(tmp_path, "py-spy", tmp_path / "dumps")

    async def main() -> Finding:
        async with live_watch(cfg, [log]) as live:
            with open(log, "ab") as fh:
                fh.write(b"step=101 loss=2.01 lr=1e-4\nstep=102 loss=nan lr=1e-4\n")
            assert await until(lambda: "nan_loss" in live.recorder.kinds())
            return next(f for f in live.recorder.findings if f.kind == "nan_loss")

    f = asyncio.run(main())
    assert f.line == 102 and f.step == 102  # not 2: counted from the file's start


@pytest.mark.unit
def test_findings_jsonl_is_strict_json(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "f.jsonl", IDENT)
    sink.send(
        Finding(
            "nan_loss",
            Severity.CRITICAL,
            0,
            "loss is NaN",
            step=3,
            evidence={"loss": math.nan, "window": [1.0, math.inf, -math.inf]},
        )
    )

    def strict(name: str) -> object:
        raise ValueError(f"bare {name} in the JSONL")

    (doc,) = [json.loads(x, parse_constant=strict) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert doc["evidence"] == {"loss": "NaN", "window": [1.0, "Infinity", "-Infinity"]}


@pytest.mark.unit
def test_disk_detector_warns_low_then_full_once_each_and_resolves() -> None:
    from rankwatch.detectors.disk import DiskDetector
    from rankwatch.events import DiskSample

    det = DiskDetector(0)
    gib = 1 << 30
    roles = {"/logs": "log", "/dumps": "dumps"}

    def at(t: float, free: int) -> list[Finding]:
        return det.judge(DiskSample(dict(roles), free, 100 * gib, t), wall=1000.0 + t)

    assert at(0, 60 * gib) == []
    assert at(5, 20 * gib) == []  # a checkpoint save's burst on a roomy disk: no alarm
    (low,) = at(100, 4 * gib)  # under min(10%, 5 GiB)
    assert low.kind == "disk_low" and low.severity is Severity.WARNING and not low.resolved
    assert "log folder /logs" in low.message and "dumps folder /dumps" in low.message and low.time == 1100.0
    assert at(101, 4 * gib) == []  # said once
    (full,) = at(102, 1000)
    assert full.severity is Severity.CRITICAL and "disk full" in full.message
    assert at(400, 5 * gib) == []  # not yet above the threshold with its margin
    (back,) = at(500, 50 * gib)
    assert back.resolved and back.severity is Severity.CRITICAL


@pytest.mark.unit
def test_disk_detector_warns_a_sustained_fill_before_the_threshold() -> None:
    from rankwatch.detectors.disk import DiskDetector
    from rankwatch.events import DiskSample

    det = DiskDetector(0)
    mib = 1 << 20
    out: list[Finding] = []
    for t in range(0, 34):  # 2 MiB filling at 50 KiB/s: a quarter left at 31 s, the threshold at 37 s
        out += det.judge(DiskSample({"/logs": "log"}, 2 * mib - t * 50 * 1024, 2 * mib, float(t)))
    (f,) = out
    assert "full in about" in f.message and f.evidence["free_bytes"] > 0.1 * 2 * mib
