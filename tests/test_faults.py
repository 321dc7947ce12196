"""Fault injection: the agent under each fault keeps running, leaves the training process
alone, loses no line or alert, and reports the failure once in its logs and metrics.

Most cases run the real ``rankwatch watch`` code path in this process (``faultlib.live_watch``)
and read its own ``/metrics``; time that is policy runs on a fake clock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from conftest import fuzz_examples
from faultlib import free_port, live_watch, metric, until
from rankwatch.config.loader import config_from_yaml, load_config
from rankwatch.runtime.reload import ConfigSource
from rankwatch.runtime.watcher import RankWatcher

pytestmark = pytest.mark.faults


def _cfg_text(tmp: Path, extra: str = "") -> str:
    return f"""\
run: {{name: faults, rank: 0}}
logs: {{format: kv, poll_interval: 50ms}}
detectors: {{warmup_steps: 5}}
process: {{sample_interval: 100ms}}
dumps: {{dir: {tmp / "dumps"}}}
server: {{listen: "127.0.0.1:0"}}
gpu: {{enabled: false}}
reload: {{interval: 50ms}}
alerts: {{spool_dir: {tmp / "spool"}}}
{extra}"""


def _lines(start: int, stop: int) -> bytes:
    return b"".join(b"step=%d loss=%.4f lr=1e-4\n" % (i, 2.0 + 1.0 / i) for i in range(start, stop))


def _count(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


# --- config hot-edited ---------------------------------------------------------------------
@pytest.mark.process
def test_config_hot_edit_invalid_keeps_last_good_then_valid_edit_applies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    path = tmp_path / "rw.yaml"
    path.write_text(_cfg_text(tmp_path, "detectors_nan: x\n").replace("detectors_nan: x\n", ""))
    base = path.read_text().replace(
        "detectors: {warmup_steps: 5}", "detectors: {warmup_steps: 5, nan: {enabled: false}}"
    )
    path.write_text(base)
    cfg = load_config(path)
    source = ConfigSource(path, lambda: load_config(path))

    async def main() -> None:
        async with live_watch(cfg, [log], config_source=source) as live:
            with open(log, "ab") as fh:
                fh.write(_lines(1, 11) + b"step=11 loss=nan lr=1e-4\n")
            assert await until(lambda: live.watcher.engine.state.last_step == 11)
            assert "nan_loss" not in live.recorder.kinds()  # disabled by the file

            bad = base.replace("nan: {enabled: false}", "nan: {enabled: maybe}")
            path.write_text(bad)
            assert await until(lambda: live.svc.reloader.reloads["error"] == 1)
            await asyncio.sleep(0.3)  # several more polls of the unchanged bad file
            text = await live.metrics()
            assert metric(text, "rankwatch_config_reloads_total", result="error") == 1
            assert metric(text, "rankwatch_config_last_reload_successful") == 0
            errors = [r for r in caplog.records if "config error" in r.getMessage()]
            assert len(errors) == 1
            assert f"{path}:3: detectors.nan.enabled" in errors[0].getMessage()
            assert "keeping the last good config" in errors[0].getMessage()
            assert cfg.detectors.nan.enabled is False  # the last good value stays in effect

            path.write_text(base.replace("nan: {enabled: false}", "nan: {enabled: true}"))
            assert await until(lambda: live.svc.reloader.reloads["ok"] == 1)
            with open(log, "ab") as fh:
                fh.write(_lines(12, 20) + b"step=20 loss=nan lr=1e-4\n")
            assert await until(lambda: "nan_loss" in live.recorder.kinds())
            text = await live.metrics()
            assert metric(text, "rankwatch_config_reloads_total", result="ok") == 1
            assert metric(text, "rankwatch_config_last_reload_successful") == 1
            (nan,) = [f for f in live.recorder.findings if f.kind == "nan_loss"]
            assert nan.step == 20
        assert _count(caplog, "config error") == 1

    asyncio.run(main())


# --- log rotation, deletion, garbage -----------------------------------------------------
def _writer(log: Path, total: int, every: int, rotate) -> threading.Thread:
    """Heavy writing (about 15k lines/s in 50-line writes), ``rotate(fh, i)`` every ``every``
    lines. A generation lives several poll intervals: one renamed away before the agent's next
    poll is never opened (as with ``tail -F``); real rotation is minutes apart."""

    def go() -> None:
        fh = open(log, "ab", buffering=0)  # noqa: SIM115
        for i in range(1, total + 1, 50):
            fh.write(_lines(i, min(i + 50, total + 1)))
            time.sleep(0.003)
            if (i - 1) % every == 0 and i > 1:
                fh = rotate(fh, i)
        fh.close()

    return threading.Thread(target=go, daemon=True)


def _spy_steps(w: RankWatcher) -> list[int]:
    """Every step the watcher's engines get, in order (wraps its record hand-off)."""
    seen: list[int] = []
    orig = w._records

    def spy(records: list) -> None:
        seen.extend(r.step for r in records if getattr(r, "step", None) is not None)
        orig(records)

    w._records = spy
    return seen


@pytest.mark.process
@pytest.mark.parametrize("mode", ["rename", "delete"])
def test_rotation_by_rename_or_delete_under_heavy_writing_loses_no_line(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    cfg = config_from_yaml(_cfg_text(tmp_path))
    total, every = 20_000, 4_000
    rotations: list[int] = []

    def rotate(fh, i: int):
        fh.close()
        if mode == "rename":
            os.replace(log, tmp_path / f"rank-0.log.{i}")
        else:
            log.unlink()
        rotations.append(i)
        return open(log, "ab", buffering=0)

    async def main() -> None:
        async with live_watch(cfg, [log]) as live:
            w = live.watcher
            seen = _spy_steps(w)
            t = _writer(log, total, every, rotate)
            t.start()
            await asyncio.to_thread(t.join, 30)
            ok = await until(lambda: w.engine.state.last_step == total, 20)
            assert ok, (w.engine.state.last_step, len(seen))
            text = await live.metrics()
            assert seen == list(range(1, total + 1))  # none lost, none twice, in order
            assert metric(text, "rankwatch_log_lines_total", result="parsed") == total
            assert metric(text, "rankwatch_log_lines_total", result="unparsed") == 0
            assert metric(text, "rankwatch_log_rotations_total") == len(rotations)
            assert metric(text, "rankwatch_internal_errors_total", component="watcher") == 0

    asyncio.run(main())


@pytest.mark.process
def test_copytruncate_under_heavy_writing_reads_every_line_once_or_leaves_it_in_the_copy(
    tmp_path: Path,
) -> None:
    """copytruncate can lose what is written between the copy and the truncate (logrotate says
    so); the agent must not add to that: every line is read once or is in a rotated copy."""
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    cfg = config_from_yaml(_cfg_text(tmp_path))
    total, every = 20_000, 4_000
    copies: list[Path] = []

    def rotate(fh, i: int):
        dst = tmp_path / f"rank-0.log.{i}"
        shutil.copyfile(log, dst)
        os.truncate(log, 0)
        copies.append(dst)
        return fh  # no pause: the writer may refill past the agent's offset before it looks

    async def main() -> None:
        async with live_watch(cfg, [log]) as live:
            w = live.watcher
            seen = _spy_steps(w)
            t = _writer(log, total, every, rotate)
            t.start()
            await asyncio.to_thread(t.join, 60)
            assert await until(lambda: w.engine.state.last_step == total, 20)
            text = await live.metrics()
            assert seen == sorted(set(seen))  # nothing read twice, order kept
            in_copies = {
                int(x.split(b"=")[1].split()[0])
                for c in copies
                for x in c.read_bytes().splitlines()
                if x.startswith(b"step=")
            }
            assert set(range(1, total + 1)) <= set(seen) | in_copies
            assert metric(text, "rankwatch_log_truncations_total") == len(copies)
            assert metric(text, "rankwatch_log_lines_total", result="unparsed") == 0

    asyncio.run(main())


@pytest.mark.process
def test_binary_garbage_and_a_50mb_line_are_cut_counted_and_parsing_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import random
    import tracemalloc

    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    cfg = config_from_yaml(_cfg_text(tmp_path))
    rnd = random.Random(7)
    garbage = bytes(rnd.randrange(256) for _ in range(200_000)).replace(b"\n", b"\x00")
    garbage = garbage.replace(b"\r", b"\x01")[:60_000] + b"\n"

    async def main() -> None:
        async with live_watch(cfg, [log]) as live:
            w = live.watcher
            tracemalloc.start()
            with open(log, "ab") as fh:
                fh.write(_lines(1, 50))
                fh.write(garbage)
                for _ in range(50):
                    fh.write(b"A" * (1 << 20))
                fh.write(b"\n")
                fh.write(_lines(50, 101))
            ok = await until(lambda: w.engine.state.last_step == 100, 60)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert ok, w.engine.state.last_step
            assert peak < 16 << 20, f"peak {peak >> 20} MiB while reading a 50 MiB line"
            text = await live.metrics()
            # Read behind a 50 MiB backlog, the step lines may be thinned (logs.shed_backlog):
            # every line is still counted, parsed or shed, and the last step is known.
            parsed = metric(text, "rankwatch_log_lines_total", result="parsed")
            shed = metric(text, "rankwatch_log_lines_total", result="shed") or 0
            assert parsed + shed == 100 and parsed >= 1, (parsed, shed)
            assert metric(text, "rankwatch_log_lines_total", result="cut") == 1
            assert metric(text, "rankwatch_internal_errors_total", component="parser") == 0
        assert _count(caplog, "longer than") == 1

    asyncio.run(main())


# --- alert sinks ---------------------------------------------------------------------------
@pytest.mark.process
def test_alertmanager_unreachable_never_blocks_detection_or_slack(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from faultlib import fake_slack

    caplog.set_level(logging.INFO, logger="rankwatch")

    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")

    async def main() -> None:
        async with fake_slack() as slack:
            extra = f"""\
alerts:
  startup_quiet: 0s
  group_wait: 0s
  backoff_max: 100ms
  max_retries: 2
  spool_dir: {tmp_path / "spool"}
  slack: {{token: xoxb-t, channel: C1, base_url: "{slack.url}/api/"}}
  alertmanager: {{urls: ["http://127.0.0.1:{free_port()}"], timeout: 1s}}
"""
            cfg = config_from_yaml(
                _cfg_text(tmp_path).replace(f"alerts: {{spool_dir: {tmp_path / 'spool'}}}\n", "") + extra
            )
            async with live_watch(cfg, [log]) as live:
                with open(log, "ab") as fh:
                    nans = b"".join(b"step=%d loss=nan lr=1e-4\n" % i for i in range(10, 30))
                    fh.write(_lines(1, 10) + nans)  # stays NaN: a resolve in the same group cancels
                assert await until(lambda: live.watcher.engine.state.last_step == 29)
                assert await until(lambda: len(slack.posted) == 1)
                stats = live.svc.dispatcher.stats
                assert await until(lambda: stats["alertmanager"]["dropped"] == 1, 20), stats
                text = await live.metrics()
                assert metric(text, "rankwatch_alerts_sent_total", sink="slack") == 1
                assert metric(text, "rankwatch_alerts_failed_total", sink="alertmanager") >= 3
                assert metric(text, "rankwatch_alerts_dropped_total", sink="alertmanager") == 1
                assert metric(text, "rankwatch_alerts_dropped_total", sink="slack") == 0
                assert "nan_loss" in live.recorder.kinds()
                # Retries are INFO; the loss itself is one ERROR line.
                errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
                assert len([m for m in errors if "alertmanager" in m]) == 1, errors

    asyncio.run(main())


def _slack_cfg(tmp: Path, url: str, **kw: object):
    from rankwatch.config.schema import AlertsConfig, SlackConfig

    base: dict = dict(startup_quiet=0.0, group_wait=0.0, spool_dir=str(tmp / "spool"))
    base.update(kw)
    return AlertsConfig(slack=SlackConfig(token="xoxb-t", channel="C1", base_url=url + "/api/"), **base)


def _finding(kind: str, step: int):
    from rankwatch.records import Finding, Severity

    return Finding(kind=kind, severity=Severity.CRITICAL, rank=0, message=f"{kind} at {step}", step=step)


@pytest.mark.process
def test_slack_down_for_five_minutes_then_back_delivers_everything_once_in_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Default retry budget, mid-range jitter, a fake clock for the five minutes."""
    from faultlib import IDENT, FakeClock, fake_slack
    from rankwatch.actions.alerts import AlertDispatcher

    caplog.set_level(logging.INFO, logger="rankwatch")

    async def main() -> None:
        clock = FakeClock()
        async with fake_slack() as slack:
            slack.down = True
            d = AlertDispatcher(_slack_cfg(tmp_path, slack.url), IDENT, clock=clock, rng=lambda: 0.5)
            task = asyncio.create_task(d.run())
            # Four problems, four messages (a loss_spike beside the NaN would be the same one).
            kinds = ["nan_loss", "loss_plateau", "stall", "crash"]
            for i, k in enumerate(kinds):
                d.send(_finding(k, 100 + i))
            assert await until(lambda: slack.refused >= 1)
            for _ in range(300):  # five minutes in 1 s ticks
                clock.advance(1.0)
                d.wake()
                await asyncio.sleep(0.005)
            assert slack.posted == [] and d.stats["slack"]["dropped"] == 0
            assert (tmp_path / "spool").exists() and any((tmp_path / "spool").iterdir())
            slack.down = False
            for _ in range(400):
                if len(slack.posted) >= len(kinds):
                    break
                clock.advance(1.0)
                d.wake()
                await asyncio.sleep(0.005)
            await d.close(2.0)
            await asyncio.wait_for(task, 5)
            got = [p["text"] for p in slack.posted]
            assert len(got) == len(kinds), got
            for text, k in zip(got, kinds, strict=False):
                assert k in text
            assert d.stats["slack"]["sent"] == 4 and d.stats["slack"]["dropped"] == 0
            assert d.stats["slack"]["failed"] == slack.refused
            assert not any((tmp_path / "spool").glob("*.jsonl"))  # delivered, so unspooled
            # Five minutes of refusals are retries (INFO), not a warning per attempt.
            loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(loud) <= 1, loud

    asyncio.run(main())


@pytest.mark.process
def test_agent_sigkilled_while_slack_is_down_resends_spooled_alerts_once_on_restart(tmp_path: Path) -> None:
    from faultlib import IDENT, FakeClock, fake_slack
    from rankwatch.actions.alerts import AlertDispatcher

    async def main() -> None:
        async with fake_slack() as slack:
            slack.down = True
            clock = FakeClock()
            first = AlertDispatcher(_slack_cfg(tmp_path, slack.url), IDENT, clock=clock, rng=lambda: 1.0)
            task = asyncio.create_task(first.run())
            first.send(_finding("nan_loss", 10))
            first.send(_finding("stall", 11))
            assert await until(lambda: any((tmp_path / "spool").glob("*.jsonl")) and slack.refused >= 1)
            # SIGKILL: no close(), no flush; the tasks just stop existing.
            task.cancel()
            for w in first.delivery.workers.values():
                if w.task is not None:
                    w.task.cancel()
            await asyncio.sleep(0.05)
            slack.down = False
            second = AlertDispatcher(_slack_cfg(tmp_path, slack.url), IDENT, clock=FakeClock())
            task2 = asyncio.create_task(second.run())
            assert await until(lambda: len(slack.posted) == 2)
            await asyncio.sleep(0.3)
            await second.close(2.0)
            await asyncio.wait_for(task2, 5)
            assert ["nan_loss" in slack.posted[0]["text"], "stall" in slack.posted[1]["text"]] == [True, True]
            assert not any((tmp_path / "spool").glob("*.jsonl"))
            third = AlertDispatcher(_slack_cfg(tmp_path, slack.url), IDENT)
            await third.close(1.0)
            assert len(slack.posted) == 2  # a third start finds nothing left to send

    asyncio.run(main())


# --- clock jump ----------------------------------------------------------------------------
class _IdleProber:
    """A live process burning no CPU (blocked in a collective), sampled on the fake clock."""

    def __init__(self, clock) -> None:
        self.clock = clock

    def sample(self):
        from rankwatch.sources.process import ProcessSample

        return ProcessSample(time=self.clock(), pid=4242, alive=True, cpu_time_s=1.0, state="sleeping")

    def pids(self) -> list[int]:
        return [4242]

    def known_pids(self) -> list[int]:
        return [4242]


@pytest.mark.unit
@pytest.mark.parametrize("jump", [3600.0, -3600.0])
def test_wall_clock_jump_neither_fires_nor_resolves_a_stall(
    monkeypatch: pytest.MonkeyPatch, jump: float
) -> None:
    """Timeouts run on the monotonic clock: an NTP step or a resume moves only time.time."""
    from faultlib import IDENT, FakeClock
    from rankwatch.records import StepRecord
    from rankwatch.runtime.watcher import RankWatcher

    cfg = config_from_yaml(
        "stall: {startup_grace: 30s, floor: 10s, factor: 3}\ndetectors: {warmup_steps: 5}\n"
        "dumps: {on_stall: false}\n"
    )
    mono = FakeClock(500.0)
    wall = [1.7e9]
    monkeypatch.setattr(time, "time", lambda: wall[0])
    found: list = []
    w = RankWatcher(cfg, IDENT, [], emit=found.append, clock=mono, wall=lambda: wall[0])
    w.prober = _IdleProber(mono)  # type: ignore[assignment]

    def tick(seconds: float, step: int | None = None) -> None:
        for _ in range(int(seconds)):
            mono.advance(1.0)
            wall[0] += 1.0
            if step is not None:
                step += 1
                w._records([StepRecord(step=step, loss=2.0, line=step, rank=0, time=wall[0])])
            asyncio.run(w.sample_once())

    tick(40, step=0)
    wall[0] += jump  # the jump: no monotonic time passes
    tick(5)  # 5 s of silence: below the 10 s timeout, whatever the wall clock did
    assert [f.kind for f in found] == []
    tick(10)  # now 15 s of real silence: one stall
    assert [(f.kind, f.resolved) for f in found] == [("stall", False)]
    wall[0] -= 2 * jump  # jumping back does not end it either
    tick(5)
    assert [(f.kind, f.resolved) for f in found] == [("stall", False)]
    tick(1, step=40)  # progress does
    assert [(f.kind, f.resolved) for f in found] == [("stall", False), ("stall", True)]


@pytest.mark.process
@pytest.mark.parametrize("jump", [3600.0, -3600.0])
def test_wall_clock_jump_neither_repeats_nor_holds_back_an_alert(tmp_path: Path, jump: float) -> None:
    """Repeat interval, group wait and retry backoff run on the dispatcher's monotonic clock: a
    wall-clock step sends no early "still firing" and delays nothing."""
    from faultlib import IDENT, FakeClock, fake_slack
    from rankwatch.actions.alerts import AlertDispatcher

    async def main() -> None:
        mono, wall = FakeClock(), [1.7e9]
        async with fake_slack() as slack:
            cfg = _slack_cfg(tmp_path, slack.url, repeat_interval=600.0, group_wait=5.0)
            d = AlertDispatcher(cfg, IDENT, clock=mono, wall=lambda: wall[0], rng=lambda: 0.5)
            task = asyncio.create_task(d.run())

            async def tick(seconds: int) -> None:
                for _ in range(seconds):
                    mono.advance(1.0)
                    wall[0] += 1.0
                    d.wake()
                    await asyncio.sleep(0.002)

            d.send(_finding("nan_loss", 10))
            wall[0] += jump  # before the group left: group_wait is not cut short nor stretched
            await tick(4)
            assert slack.posted == []
            await tick(2)
            assert await until(lambda: len(slack.posted) == 1)
            wall[0] += jump  # and after: no early repeat, none held back
            d.send(_finding("nan_loss", 11))
            await tick(590)
            assert len(slack.posted) == 1
            await tick(30)
            assert await until(lambda: len(slack.posted) == 2)
            assert "still firing" in slack.posted[1]["text"]
            await d.close(2.0)
            await asyncio.wait_for(task, 5)

    asyncio.run(main())


# --- py-spy missing, ptrace denied -----------------------------------------------------------
@pytest.mark.tool
@pytest.mark.parametrize("broken", ["missing", "ptrace_denied"])
def test_dump_without_py_spy_or_ptrace_is_reported_once_and_the_rank_is_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    import shutil
    import subprocess
    import sys

    from faultlib import IDENT
    from rankwatch.dumps.capture import find_py_spy
    from rankwatch.exporter.metrics import render
    from rankwatch.runtime.agent import Agent

    py_spy = tmp_path / "py-spy"
    real, setpriv = find_py_spy("py-spy"), shutil.which("setpriv")
    if broken == "ptrace_denied" and os.geteuid() == 0 and real and setpriv:
        # The kernel's own refusal: py-spy as nobody may not trace a root-owned rank.
        tmp_path.chmod(0o755)
        drop = f"{setpriv} --reuid=65534 --regid=65534 --clear-groups"
        py_spy.write_text(f'#!/bin/sh\nexec {drop} {real} "$@"\n')
        py_spy.chmod(0o755)
    elif broken == "ptrace_denied":  # not root: what py-spy prints when refused
        py_spy.write_text("#!/bin/sh\necho 'Error: Permission denied (os error 13)' >&2\nexit 1\n")
        py_spy.chmod(0o755)
    cfg = config_from_yaml(
        f"dumps: {{dir: {tmp_path / 'dumps'}, py_spy: {py_spy}, flight_recorder: false}}\n"
    )
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        agent = Agent(cfg, IDENT)
        agent.add_watcher([]).attach(rank.pid)
        folder = asyncio.run(agent.capture_dumps("manual"))
        assert folder is not None and agent.dumps_captured == 1
        text = (folder / "rank-0.txt").read_text()
        want = "not found" if broken == "missing" else "ptrace"
        assert want in text.lower(), text
        assert _count(caplog, "stack dump failed") == 1
        reason = "py-spy not found" if broken == "missing" else "ptrace denied"
        assert agent.dumps_failed == {reason: 1}
        exposed = re.search(
            rf'rankwatch_dumps_failed_total{{[^}}]*reason="{reason}"[^}}]*}} (\S+)', render(agent).decode()
        )
        assert exposed and float(exposed.group(1)) == 1.0
        from rankwatch.records import Finding, Severity

        agent.emit(Finding("stall", Severity.CRITICAL, 0, "no progress for 61s."))
        msg = agent.findings[-1].message
        assert "Stacks are being captured" not in msg and "Stack dumps will fail" in msg
        assert ("pip install py-spy" if broken == "missing" else "CAP_SYS_PTRACE") in msg
        assert rank.poll() is None  # the rank runs on
    finally:
        rank.kill()
        rank.wait(10)


# --- bounded fuzzing of the config loader and the whole line pipeline ----------------------
@pytest.mark.unit
def test_fuzz_config_loader_only_ever_raises_config_error() -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from rankwatch.config.loader import ConfigError, config_from_dict

    keys = st.sampled_from(
        [
            "run",
            "logs",
            "detectors",
            "stall",
            "alerts",
            "gpu",
            "format",
            "factor",
            "interval",
            "dir",
            "warmup_steps",
            "loss_spike",
            "slack",
            "urls",
            "<<",
            "*",
            "&a",
            "reload",
            "x",
        ]
    )
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
    trees = st.recursive(
        scalars,
        lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(keys, c, max_size=3)),
        max_leaves=12,
    )
    soup = st.text(
        alphabet=st.sampled_from(list("abc:{}[]-,&*!|>'\"#%@` \n\t$12.5sm\x00\ufeff")), max_size=120
    )

    @settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(soup, st.text(max_size=80)), st.dictionaries(keys, trees, max_size=4))
    def check(text: str, data: dict) -> None:
        for build in (lambda: config_from_yaml(text, env={"X": "1"}), lambda: config_from_dict(data)):
            try:
                build()
            except ConfigError:
                pass

    check()


@pytest.mark.unit
def test_fuzz_the_live_line_pipeline_never_raises() -> None:
    """Every parser behind format sniffing, the error signatures and the decorations, as the
    live watcher feeds them (test_parser_properties covers each FormatParser alone)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from rankwatch.sources.logparser import LogParser
    from rankwatch.sources.parsers import FORMATS

    pieces = st.sampled_from(
        [
            "step=",
            "loss",
            "nan",
            "iteration",
            "|",
            "{'loss': ",
            "Traceback (most recent call last):\n",
            "CUDA out of memory",
            "NCCL",
            "Watchdog caught collective operation timeout",
            "[rank1]: ",
            "\x1b[31m",
            "\r",
            "Epoch 1: ",
            "%|",
            "1e400",
            " ",
            "\n",
            "0.5",
            "Xid",
            "RuntimeError: ",
        ]
    )
    texts = st.lists(st.one_of(st.text(max_size=60), pieces), max_size=40).map("".join)

    @settings(max_examples=fuzz_examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(texts, st.sampled_from(["auto", *[f for f in FORMATS if f != "regex"]]), st.booleans())
    def check(text: str, fmt: str, cut: bool) -> None:
        p = LogParser(default_rank=0, fmt=fmt)
        for i, line in enumerate(text.split("\n"), 1):
            p.feed(line, i, cut=cut and i % 3 == 0, now=1.0)
        p.release_pending()
        p.finish()
        assert p.stats.errors == 0

    check()
