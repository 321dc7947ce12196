"""Config hot reload on a live agent: a new snapshot reaches the running detectors.

The grad-clipping window is a deque's length: a reload that copied the new window into the
config in place left the deque at its old length, and the detector's running count of
over-threshold steps drifted until ``grad_clipping_saturated`` fired on a run that was fine.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from faultlib import live_watch, until
from rankwatch.config.loader import load_config
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.runtime.reload import ConfigReloader, ConfigSource, changed_keys

pytestmark = pytest.mark.faults


def _cfg_text(tmp: Path, window: int) -> str:
    return f"""\
run: {{name: reload, rank: 0}}
logs: {{format: kv, poll_interval: 50ms}}
detectors: {{warmup_steps: 0, grad_clipping: {{window: {window}, max_grad_norm: 1.0, fraction: 0.9}}}}
process: {{sample_interval: 100ms}}
dumps: {{dir: {tmp / "dumps"}, on_stall: false}}
server: {{listen: "127.0.0.1:0"}}
gpu: {{enabled: false}}
reload: {{interval: 50ms}}
alerts: {{spool_dir: {tmp / "spool"}}}
"""


def _half_clipped(start: int, stop: int) -> bytes:
    """Every other step above max_grad_norm: 50 % clipped, far below the 90 % that saturates."""
    return b"".join(
        b"step=%d loss=2.0 grad_norm=%s lr=1e-4\n" % (i, b"3.0" if i % 2 else b"0.5")
        for i in range(start, stop)
    )


@pytest.mark.process
@pytest.mark.parametrize(("before", "after"), [(40, 10), (10, 40)])
def test_reloading_the_clipping_window_gives_no_false_saturation(
    tmp_path: Path, before: int, after: int
) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"")
    path = tmp_path / "rw.yaml"
    path.write_text(_cfg_text(tmp_path, before))
    cfg = load_config(path)
    source = ConfigSource(path, lambda: load_config(path))

    async def main() -> None:
        async with live_watch(cfg, [log], config_source=source) as live:
            with open(log, "ab") as fh:
                fh.write(_half_clipped(1, 61))
            assert await until(lambda: live.watcher.engine.state.last_step == 60)
            path.write_text(_cfg_text(tmp_path, after))
            reloader = live.svc.reloader
            assert reloader is not None
            assert await until(lambda: reloader.reloads["ok"] == 1)
            assert reloader.current.detectors.grad_clipping.window == after
            with open(log, "ab") as fh:
                fh.write(_half_clipped(61, 400))
            assert await until(lambda: live.watcher.engine.state.last_step == 399)
            assert "grad_clipping_saturated" not in live.recorder.kinds()
            assert cfg.detectors.grad_clipping.window == before  # the snapshot in use never changed

    asyncio.run(main())


@pytest.mark.unit
def test_a_reload_reports_what_the_components_took_and_what_needs_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "rw.yaml"
    path.write_text("alerts: {min_severity: warning}\ndumps: {dir: a}\n")
    cfg = load_config(path)
    taken: list[tuple[Config, Config]] = []

    def hand_over(old: Config, new: Config) -> Config:
        taken.append((old, new))
        return replaced(old, alerts=new.alerts)

    r = ConfigReloader(ConfigSource(path, lambda: load_config(path)), cfg, hand_over=hand_over)
    assert r.check() is None
    path.write_text("alerts: {min_severity: critical}\ndumps: {dir: b}\n")
    assert r.check() == "ok"
    assert taken and taken[0][0] is cfg
    assert cfg.alerts.min_severity == "warning"  # snapshots are never edited
    assert r.current.alerts.min_severity == "critical" and r.current.dumps.dir == "a"
    (msg,) = [x.getMessage() for x in caplog.records if "reloaded" in x.getMessage()]
    assert "applied alerts.min_severity" in msg
    assert "needs a restart to take effect: dumps.dir" in msg


@pytest.mark.unit
def test_changed_keys_are_dotted_in_schema_order() -> None:
    old = Config()
    new = replaced(old, {"detectors.grad_clipping.window": 5, "dumps.dir": "x"})
    assert changed_keys(old, new) == ["detectors.grad_clipping.window", "dumps.dir"]


@pytest.mark.unit
def test_a_config_snapshot_cannot_be_edited() -> None:
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.dumps.dir = "elsewhere"  # type: ignore[misc]


@pytest.mark.unit
def test_a_detector_takes_new_thresholds_live_and_is_rebuilt_when_its_window_changes() -> None:
    """What a detector can take is derived from the detector, not listed: a threshold read on
    every use is taken in place (its state stays), a window that sized a deque rebuilds it,
    with its open episode, so the active alert still resolves once."""
    from rankwatch.detectors.grads import GradClippingDetector
    from rankwatch.engine import RankEngine
    from rankwatch.records import StepRecord

    cfg = replaced(Config(), {"detectors.warmup_steps": 0, "detectors.grad_clipping.window": 10})
    engine = RankEngine(cfg, 0)
    found = [f for i in range(1, 21) for f in engine.feed(StepRecord(step=i, loss=2.0, grad_norm=5.0))]
    assert [f.kind for f in found] == ["grad_clipping_saturated"]
    det = engine.detector(GradClippingDetector)

    engine.reconfigure(replaced(engine.cfg, {"detectors.grad_clipping.max_grad_norm": 10.0}))
    assert engine.detector(GradClippingDetector) is det
    assert det is not None and det.cfg.max_grad_norm == 10.0  # type: ignore[attr-defined]

    engine.reconfigure(replaced(engine.cfg, {"detectors.grad_clipping.window": 4}))
    fresh = engine.detector(GradClippingDetector)
    assert fresh is not det and fresh.flags.maxlen == 4  # type: ignore[union-attr]
    found = [f for i in range(21, 31) for f in engine.feed(StepRecord(step=i, loss=2.0, grad_norm=0.5))]
    assert [(f.kind, f.resolved) for f in found] == [("grad_clipping_saturated", True)]
