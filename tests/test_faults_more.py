"""More fault injection: full filesystems under the agent's own writes and the checkpoints it
judges, NVML failing mid-run, a rank that forks and exits, and SIGTERM while a dump is in flight.

Each case checks that the agent keeps running, leaves the training processes alone, and says
what failed once in its logs and once (as a counter or a finding) in its metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from faultlib import fake_slack, live_watch, metric, until, wait_for
from rankwatch.config.loader import config_from_yaml

pytestmark = pytest.mark.faults


def _cfg_text(tmp: Path, extra: str = "", *, dumps: Path | None = None, spool: Path | None = None) -> str:
    return f"""\
run: {{name: faults, rank: 0}}
logs: {{format: kv, poll_interval: 50ms}}
detectors: {{warmup_steps: 5}}
process: {{sample_interval: 100ms}}
dumps: {{dir: {dumps or tmp / "dumps"}, flight_recorder: false}}
server: {{listen: "127.0.0.1:0"}}
reload: {{interval: 0s}}
{extra}"""


def _lines(start: int, stop: int) -> bytes:
    return b"".join(b"step=%d loss=%.4f lr=1e-4\n" % (i, 2.0 + 1.0 / i) for i in range(start, stop))


def _count(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --- full filesystems -----------------------------------------------------------------------
@contextlib.contextmanager
def _tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
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


def _fill(fs: Path, leave: int = 0) -> Path:
    """Fill ``fs`` to ENOSPC, then give back ``leave`` bytes (tmpfs counts whole pages)."""
    filler = fs / ".filler"
    with open(filler, "wb", buffering=0) as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 4096)
    if leave:
        os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


@pytest.mark.process
def test_checkpoint_dir_on_a_full_filesystem_warns_before_and_judges_the_torn_save(tmp_path: Path) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    with _tmpfs(tmp_path / "ckpt") as ckpt:
        log = tmp_path / "rank-0.log"
        log.write_bytes(b"")
        src = tmp_path / "src.safetensors"
        save_file({"w": np.zeros(115_000, dtype=np.float32)}, str(src))
        data = src.read_bytes()  # ~460 KB: one fits on 1 MiB with room to spare, 1.5 x does not
        (ckpt / "ckpt_100.safetensors").write_bytes(data)
        extra = (
            f"gpu: {{enabled: false}}\ncheckpoints: {{dir: {ckpt}, mode: poll, poll_interval: 100ms,"
            " settle: 300ms, incomplete_after: 1s, corrupt_after: 1s}\n"
        )
        cfg = config_from_yaml(_cfg_text(tmp_path, extra))

        async def main() -> None:
            async with live_watch(cfg, [log]) as live:
                cw = live.svc.checkpoints
                assert await until(lambda: cw.last_good() is not None, 20)
                assert await until(lambda: "disk_low" in live.recorder.kinds(), 10)
                (warn,) = [f for f in live.recorder.findings if f.kind == "disk_low"]
                assert warn.severity.label == "warning" and "likely fail" in warn.message

                (ckpt / "other.bin").write_bytes(b"\0" * (200 << 10))  # something else takes space
                assert await until(
                    lambda: len([f for f in live.recorder.findings if f.kind == "disk_low"]) == 2
                )
                # The trainer's next save hits the full disk.
                with pytest.raises(OSError) as exc, open(ckpt / "ckpt_200.safetensors", "wb") as fh:
                    fh.write(data)
                assert exc.value.errno == errno.ENOSPC
                assert 0 < (ckpt / "ckpt_200.safetensors").stat().st_size < len(data)

                def judged() -> list:
                    return [f for f in live.recorder.findings if f.kind.startswith("checkpoint_")]

                assert await until(lambda: bool(judged()), 20)
                with open(log, "ab") as fh:
                    fh.write(_lines(1, 21))
                assert await until(lambda: live.watcher.engine.state.last_step == 20)
                await asyncio.sleep(0.5)  # several more scans of the same torn file
                (bad,) = judged()
                assert bad.kind in ("checkpoint_corrupt", "checkpoint_incomplete")
                assert "ckpt_200.safetensors" in bad.message
                assert "last good: ckpt_100.safetensors" in bad.message
                disk = [
                    (f.severity.label, f.resolved) for f in live.recorder.findings if f.kind == "disk_low"
                ]
                assert disk == [("warning", False), ("critical", False)]
                assert cw.last_good().name == "ckpt_100.safetensors"
                text = await live.metrics()
                assert metric(text, "rankwatch_checkpoint_fs_free_bytes") == 0
                assert metric(text, "rankwatch_checkpoint_last_good_step") == 100
                assert metric(text, "rankwatch_checkpoint_scan_errors_total") == 0
                assert metric(text, "rankwatch_findings_total", kind="disk_low", severity="critical") == 1

        asyncio.run(main())


@pytest.mark.unit
def test_statvfs_failing_or_reporting_no_space_never_stops_the_checkpoint_watcher(tmp_path: Path) -> None:
    from rankwatch.checkpoints import CheckpointConfig
    from rankwatch.checkpoints.watcher import CheckpointWatcher
    from rankwatch.config.schema import Config
    from rankwatch.engine import RankEngine

    gib = 1 << 30
    answers: list[object] = [10 * gib, 64 << 10, OSError(errno.EIO, "Input/output error"), 0, 10 * gib]

    def statvfs(path: str) -> os.statvfs_result:
        a = answers.pop(0)
        if isinstance(a, OSError):
            raise a
        free = int(a) // 4096
        return os.statvfs_result((4096, 4096, 100 * gib // 4096, free, free, 1000, 1000, 1000, 0, 255))

    ckpt = CheckpointConfig(min_free=1 << 20)
    w = CheckpointWatcher(tmp_path, ckpt, statvfs=statvfs)
    # The free-space rule is a detector: the watcher's scans reach it through an engine.
    eng = RankEngine(Config(checkpoints=dataclasses.replace(ckpt, dir=str(tmp_path))), 0)
    seen = []
    for _ in range(5):
        fs = [f for e in w.tick() for f in eng.feed(e)]
        assert w.last_scan is not None
        seen += [(f.kind, f.severity.label, f.resolved) for f in fs + eng.feed(w.last_scan)]
    assert seen == [("disk_low", "warning", False), ("disk_low", "warning", True)]
    assert w.scans == 5 and w.errors == 0
    assert w.snapshot()["fs_free_bytes"] == 10 * gib


@pytest.mark.tool
def test_dumps_dir_on_a_full_filesystem_loses_the_stacks_not_the_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    py_spy = tmp_path / "py-spy"
    py_spy.write_text(f"#!{sys.executable}\nprint('[]')\n")
    py_spy.chmod(0o755)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with _tmpfs(tmp_path / "dumps") as dumps:
            filler = _fill(dumps)
            log = tmp_path / "rank-0.log"
            log.write_bytes(b"")
            extra = (
                "gpu: {enabled: false}\nstall: {startup_grace: 20s, floor: 1s, factor: 2}\n"
                f"alerts: {{spool_dir: {tmp_path / 'spool'}}}\n"
            )
            cfg = config_from_yaml(
                _cfg_text(tmp_path, extra, dumps=dumps).replace(
                    "flight_recorder", f"py_spy: {py_spy}, flight_recorder"
                )
            )

            async def main() -> None:
                async with live_watch(cfg, [log], pids=[rank.pid]) as live:
                    agent = live.svc.agent
                    for first in (1, 4, 7):  # bursts apart, so a step interval is measured
                        with open(log, "ab") as fh:
                            fh.write(_lines(first, first + 3))
                        await asyncio.sleep(0.2)
                    assert await until(lambda: "stall" in live.recorder.kinds(), 20)
                    assert await until(lambda: agent.internal_errors_by_component.get("dumps", 0) >= 1, 20)
                    await agent.settle(10)
                    assert await agent.capture_dumps("manual") is None  # still full: lost again, quietly
                    assert agent.dumps_captured == 0
                    text = await live.metrics()
                    assert metric(text, "rankwatch_internal_errors_total", component="dumps") == 2
                    assert metric(text, "rankwatch_dumps_captured_total") == 0
                    with open(log, "ab") as fh:
                        fh.write(_lines(10, 13))  # progress: detection went on
                    assert await until(lambda: live.recorder.kinds(active=False).count("stall") == 2)

                    filler.unlink()  # space again: the next dump lands whole
                    folder = await agent.capture_dumps("manual")
                    assert folder is not None and (folder / "rank-0.txt").exists()
                    doc = json.loads((folder / "rank-0.json").read_text())
                    assert doc["ok"] is True and doc["pid"] == rank.pid
                    leftovers = [p.name for p in dumps.rglob("*") if p.name.endswith(".tmp")]
                    assert leftovers == []

            asyncio.run(main())
            assert _count(caplog, "cannot write stack dumps") == 1
            assert _count(caplog, "dump capture failed") == 0
            assert rank.poll() is None
    finally:
        rank.kill()
        rank.wait(10)


@pytest.mark.process
def test_alert_spool_on_a_full_filesystem_is_reported_once_and_alerts_still_go_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    with _tmpfs(tmp_path / "spool") as spool:
        _fill(spool)

        async def main() -> None:
            async with fake_slack() as slack:
                slack.down = True
                extra = f"""\
gpu: {{enabled: false}}
alerts:
  startup_quiet: 0s
  group_wait: 0s
  backoff_max: 100ms
  max_retries: 50
  spool_dir: {spool}
  slack: {{token: xoxb-t, channel: C1, base_url: "{slack.url}/api/"}}
"""
                cfg = config_from_yaml(_cfg_text(tmp_path, extra))
                async with live_watch(cfg, [log]) as live:
                    with open(log, "ab") as fh:
                        nans = b"".join(b"step=%d loss=nan lr=1e-4\n" % i for i in range(10, 20))
                        fh.write(_lines(1, 10) + nans)
                    assert await until(lambda: slack.refused >= 3)
                    text = await live.metrics()
                    assert metric(text, "rankwatch_internal_errors_total", component="alerts") >= 1
                    with open(log, "ab") as fh:
                        fh.write(_lines(20, 31))
                    assert await until(lambda: live.watcher.engine.state.last_step == 30)
                    slack.down = False
                    # The full spool filesystem is itself a finding (disk_low), sent too.
                    assert await until(lambda: any("nan_loss" in p["text"] for p in slack.posted))
                    assert live.svc.dispatcher.stats["slack"]["dropped"] == 0

        asyncio.run(main())
    assert _count(caplog, "unusable") == 1


@pytest.mark.process
def test_spool_append_cut_by_a_full_disk_leaves_no_torn_line_behind(tmp_path: Path) -> None:
    from rankwatch.actions.alerts.spool import Spool, SpoolEntry

    with _tmpfs(tmp_path / "spool") as fs:
        filler = _fill(fs, leave=8192)
        spool = Spool(fs / "r.rank-0.jsonl", 1 << 20)
        big = [SpoolEntry(f"id{i}", "slack", {"text": "x" * 4000}) for i in range(4)]
        with pytest.raises(OSError) as exc:
            spool.append(big)
        assert exc.value.errno == errno.ENOSPC
        assert not spool.path.exists() or spool.path.stat().st_size == 0
        filler.unlink()
        spool.append([SpoolEntry("later", "slack", {"text": "nan_loss"})])
        assert [e.id for e in spool.load()] == ["later"]


# --- NVML failing in the middle of a run ---------------------------------------------------
@pytest.mark.process
def test_nvml_failing_hanging_and_losing_the_gpu_mid_run(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from gpufake import FakeBackend, healthy
    from rankwatch.gpu.backend import FIELDS, GpuError

    caplog.set_level(logging.INFO)
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    fb = FakeBackend([healthy(0)], xid_supported=False)
    gpu = fb.gpus[0]
    good = dict(gpu.fields)
    extra = "gpu: {enabled: true, interval: 50ms, call_timeout: 300ms, lost_reprobe: 100ms, xid_wait: 0s}\n"
    cfg = config_from_yaml(_cfg_text(tmp_path, extra + f"alerts: {{spool_dir: {tmp_path / 'spool'}}}\n"))
    step = [0]

    async def progress(live) -> None:
        with open(log, "ab") as fh:
            fh.write(_lines(step[0] + 1, step[0] + 6))
        step[0] += 5
        assert await until(lambda: live.watcher.engine.state.last_step == step[0])

    async def main() -> None:
        async with live_watch(cfg, [log], gpu_backend=fb) as live:
            sampler = live.svc.source("gpu").sampler

            async def up() -> float | None:
                return metric(await live.metrics(), "rankwatch_gpu_collector_up")

            assert await until(lambda: bool(sampler.latest()) and sampler.latest()[0].temperature == 62.0)
            assert await up() == 1
            await progress(live)

            # 1. the driver starts failing every call (unloaded, wedged): one line, collector down
            for name in FIELDS:
                gpu.fields[name] = lambda t: GpuError("failed", "Driver Not Loaded", code=9)
            assert await until(lambda: not sampler.up)
            rounds = fb.calls["memory"]
            assert await until(lambda: fb.calls["memory"] >= rounds + 5)  # no crash loop: it samples on
            text = await live.metrics()
            assert metric(text, "rankwatch_gpu_collector_up") == 0
            assert metric(text, "rankwatch_gpu_temperature_celsius") is None  # no fake zeros
            assert metric(text, "rankwatch_internal_errors_total", component="gpu") >= 5
            await progress(live)
            gpu.fields.update(good)
            assert await until(lambda: sampler.up)
            assert await up() == 1

            # 2. a call hangs past gpu.call_timeout: samples are skipped, not piled up
            release = threading.Event()
            gpu.hang["memory"] = release
            try:
                assert await until(lambda: sampler.timeouts == 1 and not sampler.up, 5)
                reads = fb.calls["memory"]
                await asyncio.sleep(0.5)
                assert sampler.timeouts == 1 and fb.calls["memory"] == reads  # skipped, not piled up
                assert await up() == 0
                await progress(live)
            finally:
                del gpu.hang["memory"]
                release.set()
            assert await until(lambda: sampler.up)

            # 3. the GPU falls off the bus, then answers again
            gpu.lost_at = 0
            assert await until(lambda: "gpu_lost" in live.recorder.kinds())
            await asyncio.sleep(0.5)  # several re-probes while lost
            text = await live.metrics()
            assert metric(text, "rankwatch_gpu_lost", gpu="0") == 1
            assert metric(text, "rankwatch_findings_total", kind="gpu_lost", severity="critical") == 1
            await progress(live)
            gpu.lost_at = None
            assert await until(lambda: any(f.resolved for f in live.recorder.findings))
            assert metric(await live.metrics(), "rankwatch_gpu_lost", gpu="0") == 0
            assert [(f.kind, f.resolved) for f in live.recorder.findings] == [
                ("gpu_lost", False),
                ("gpu_lost", True),
            ]
            assert live.watcher.engine.state.last_step == 20

    asyncio.run(main())
    assert _count(caplog, "NVML fails every reading") == 1
    assert _count(caplog, "reading memory failed") == 0  # one line for the driver, not one per field
    assert _count(caplog, "NVML did not answer") == 1
    assert _count(caplog, "GPU 0 is lost") == 1
    assert _count(caplog, "NVML answers again") == 2


# --- the rank forks and exits ---------------------------------------------------------------
_FORKER = """\
import subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep({linger})"])
open({pidfile!r}, "w").write(str(kid.pid))
for i in range(1, 6):
    print(f"step={{i}} loss=2.0 lr=1e-4", flush=True)
if {wait}:
    kid.wait()
sys.exit({code})
"""


def _forker(tmp: Path, *, code: int, linger: float, wait: bool) -> list[str]:
    src = _FORKER.format(linger=linger, pidfile=str(tmp / "kid.pid"), wait=wait, code=code)
    return [sys.executable, "-c", src]


@pytest.mark.process
@pytest.mark.parametrize(
    ("code", "linger", "wait"), [(3, 60.0, False), (0, 0.3, True)], ids=["exits-kid-lingers", "clean"]
)
def test_run_mode_rank_that_forks_then_exits_is_reported_once_and_not_waited_for(
    tmp_path: Path, code: int, linger: float, wait: bool
) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        _cfg_text(
            tmp_path, f"gpu: {{enabled: false}}\nrunner: {{log_dir: {tmp_path / 'logs'}, term_grace: 3s}}\n"
        )
    )
    jsonl = tmp_path / "findings.jsonl"
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--findings-jsonl", str(jsonl)]
    t0 = time.monotonic()
    out = subprocess.run(
        [*cmd, "--", *_forker(tmp_path, code=code, linger=linger, wait=wait)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, RANK="0"),
    )
    elapsed = time.monotonic() - t0
    kid = int((tmp_path / "kid.pid").read_text())
    try:
        assert out.returncode == code, out.stderr
        assert elapsed < 20, elapsed  # not held up by the grandchild (60 s)
        lines = jsonl.read_text().splitlines() if jsonl.exists() else []
        ends = [f for f in map(json.loads, lines) if f["kind"] in ("crash", "process_exit")]
        if code:
            (crash,) = ends
            assert crash["kind"] == "crash" and crash["evidence"]["exit_code"] == code
            assert _alive(kid)  # the agent kills nothing of the job on its own
        else:
            assert ends == []
        assert "step=5" in out.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(kid, signal.SIGKILL)


@pytest.mark.process
def test_watch_mode_rank_that_forks_then_exits_is_one_exit_and_the_agent_ends_cleanly(
    tmp_path: Path,
) -> None:
    """The rank's child lives on; the rank's own exit is one info finding, and the agent,
    watching only that --pid, flushes and ends by itself."""
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    cfg = config_from_yaml(
        _cfg_text(tmp_path, f"gpu: {{enabled: false}}\nalerts: {{spool_dir: {tmp_path}}}\n")
    )
    with open(log, "ab") as out:
        rank = subprocess.Popen(
            [sys.executable, "-c", _forker_slow(tmp_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    kid_file = tmp_path / "kid.pid"
    try:

        async def main() -> None:
            async with live_watch(cfg, [log], pids=[rank.pid], may_stop=True) as live:
                assert await until(lambda: live.watcher.engine.state.last_step == 5)
                assert (await live.metrics()) is not None
                (tmp_path / "go").write_text("")
                assert await until(lambda: live.watcher.exited, 20)
                await asyncio.sleep(0.5)  # more samples after the exit
                ends = [f for f in live.recorder.findings if f.kind in ("crash", "process_exit")]
                assert [(f.kind, f.severity.label) for f in ends] == [("process_exit", "info")]
                assert _alive(int(kid_file.read_text()))

        asyncio.run(main())
        assert rank.wait(10) == 0
    finally:
        rank.kill()
        if kid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(kid_file.read_text()), signal.SIGKILL)


def _forker_slow(tmp: Path) -> str:
    """Waits for the agent to attach before it exits, so the exit is seen live."""
    return (
        "import os, subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(tmp / 'kid.pid')!r}, 'w').write(str(kid.pid))\n"
        "for i in range(1, 6):\n    print(f'step={i} loss=2.0 lr=1e-4', flush=True)\n"
        f"while not os.path.exists({str(tmp / 'go')!r}):\n    time.sleep(0.02)\n"
        "sys.exit(0)\n"
    )


# --- SIGTERM while a stall dump is in flight ---------------------------------------------------
@pytest.mark.tool
def test_sigterm_during_a_slow_dump_exits_in_bounds_and_leaves_a_readable_incident(tmp_path: Path) -> None:
    mark = tmp_path / "py-spy.pid"
    py_spy = tmp_path / "py-spy"
    py_spy.write_text(
        f"#!{sys.executable}\nimport os, time\n"
        f"open({str(mark)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    py_spy.chmod(0o755)
    dumps = tmp_path / "dumps"
    cfg = tmp_path / "rw.yaml"
    term_grace, dump_timeout = 3.0, 3.0
    cfg.write_text(
        _cfg_text(
            tmp_path,
            "gpu: {enabled: false}\nstall: {startup_grace: 20s, floor: 2s, factor: 10}\n"
            f"runner: {{log_dir: {tmp_path / 'logs'}, term_grace: {term_grace:g}s}}\n",
        ).replace(
            "flight_recorder: false", f"flight_recorder: false, py_spy: {py_spy}, timeout: {dump_timeout:g}s"
        )
    )
    child = (
        "import time\nfor i in range(1, 11):\n    print(f'step={i} loss=2.0 lr=1e-4', flush=True)\n"
        "    time.sleep(0.05)\ntime.sleep(120)\n"
    )
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
    p = subprocess.Popen(
        [*cmd, "--", sys.executable, "-c", child],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, RANK="0"),
    )
    try:
        assert wait_for(lambda: mark.exists() and mark.read_text() != "", 30), "no dump started"
        spy = int(mark.read_text())
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    _, err = p.communicate(timeout=10)
    assert rc == 143, err
    assert elapsed < term_grace + dump_timeout + 3.0, elapsed
    assert not _alive(spy)  # no orphaned py-spy
    (incident,) = [d for d in (dumps / "faults").iterdir() if d.is_dir()]
    assert sorted(x.name for x in incident.iterdir() if x.name.startswith("rank-")) == [
        "rank-0.json",
        "rank-0.txt",
    ]
    assert not [x for x in incident.iterdir() if x.name.endswith(".tmp")]
    doc = json.loads((incident / "rank-0.json").read_text())
    assert doc["ok"] is False and doc["error"] == "timeout"
    assert "FAILED: timeout" in (incident / "rank-0.txt").read_text()
    base = [sys.executable, "-m", "rankwatch", "dumps"]
    ls = subprocess.run([*base, "list", "--dir", str(dumps)], capture_output=True, text=True, timeout=30)
    assert ls.returncode == 0 and incident.name in ls.stdout, ls.stderr
    diff = subprocess.run(
        [*base, "diff", incident.name, "--dir", str(dumps)], capture_output=True, text=True, timeout=30
    )
    assert diff.returncode in (0, 1) and "Traceback" not in diff.stderr, diff.stderr
    got = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines() if x.strip()]
    assert [f["kind"] for f in got if f["kind"] in ("crash", "process_exit")] == ["process_exit"]
