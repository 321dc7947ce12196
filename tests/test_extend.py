"""Adding a detector, a polled source, a metric collector or an alert sink is one file.

Each test copies the package into a temporary folder, adds one throwaway plugin file there
(and nothing else), and runs the real program from that copy in a child process, which shows
the plugin found, built and used: a detector's finding in ``analyze``, a collector's series
in a scrape of the agent's registry, a sink's delivery, a source's events. README's
Development section shows the same files.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

PACKAGE = Path(__file__).resolve().parent.parent / "agent" / "rankwatch"


def _copy(tmp_path: Path, plugin: str, code: str) -> Path:
    root = tmp_path / "pkg"
    shutil.copytree(PACKAGE, root / "rankwatch", ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "rankwatch" / plugin
    assert not target.exists()
    target.write_text(textwrap.dedent(code))
    return root


def _run(
    root: Path, *args: str, code: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "HOME": str(root)}
    cmd = (
        [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, "-m", "rankwatch", *args]
    )
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=cwd or root)
    return res


DETECTOR = '''
    """Flags a loss above 100: a throwaway detector, one file."""
    from __future__ import annotations

    from rankwatch.config.schema import Config
    from rankwatch.detectors.base import Detector, DetectorContext
    from rankwatch.detectors.registry import register
    from rankwatch.records import Finding, Severity, StepRecord
    from rankwatch.state import RankState


    @register
    class BigLossDetector(Detector):
        kinds = ("big_loss",)
        accepts = (StepRecord,)

        @classmethod
        def create(cls, cfg: Config, ctx: DetectorContext) -> BigLossDetector:
            return cls()

        def __init__(self) -> None:
            pass

        def observe(self, state: RankState, record: object) -> list[Finding]:
            if isinstance(record, StepRecord) and record.loss is not None and record.loss > 100:
                return [Finding("big_loss", Severity.WARNING, state.rank, "loss over 100", step=record.step)]
            return []
'''


def test_a_detector_is_one_file(tmp_path: Path) -> None:
    root = _copy(tmp_path, "detectors/big_loss.py", DETECTOR)
    log = tmp_path / "train.log"
    log.write_text("".join(f"step={i} loss={2.0 if i != 7 else 150.0}\n" for i in range(1, 12)))
    res = _run(root, "analyze", "--json", str(log))
    doc = json.loads(res.stdout)
    big = [f for f in doc["findings"] if f["kind"] == "big_loss"]
    assert [(f["step"], f["severity"]) for f in big] == [(7, "warning")], res.stdout + res.stderr
    assert res.returncode == 1


COLLECTOR = '''
    """A throwaway collector: the number of watched ranks, one file."""
    from __future__ import annotations

    from collections.abc import Mapping

    from prometheus_client.core import GaugeMetricFamily, Metric

    from rankwatch.exporter.collector import register
    from rankwatch.snapshot import AgentSnapshot


    @register("hello")
    def collect_hello(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
        g = GaugeMetricFamily("rankwatch_hello_ranks", "Ranks this agent watches")
        g.add_metric([], float(len(snap.ranks)))
        return [g]
'''


def test_a_metric_collector_is_one_file(tmp_path: Path) -> None:
    root = _copy(tmp_path, "exporter/hello.py", COLLECTOR)
    code = """
        from pathlib import Path
        from rankwatch.config.schema import Config
        from rankwatch.exporter.metrics import render
        from rankwatch.identity import Identity
        from rankwatch.runtime.agent import Agent

        agent = Agent(Config(), Identity(run="ext", rank=0, local_rank=0, world_size=1, node="n"))
        agent.add_watcher([Path("rank-0.log").resolve()])
        print(render(agent).decode())
    """
    res = _run(root, code=code)
    assert "rankwatch_hello_ranks 1.0" in res.stdout, res.stdout[-2000:] + res.stderr
    assert 'rankwatch_collector_success{collector="hello"' in res.stdout


SINK = '''
    """A throwaway sink that appends each alert's title to a file named in the environment."""
    from __future__ import annotations

    import os

    from rankwatch.actions.alerts.message import AlertMessage, AlertSink
    from rankwatch.actions.alerts.sinks import register_sink
    from rankwatch.config.schema import AlertsConfig


    class FileSink:
        name = "file"

        async def send(self, alert: AlertMessage) -> None:
            with open(os.environ["HELLO_SINK_FILE"], "a") as fh:
                fh.write(alert.title + "\\n")


    @register_sink("file")
    def file_sinks(cfg: AlertsConfig) -> list[AlertSink]:
        return [FileSink()] if os.environ.get("HELLO_SINK_FILE") else []
'''


def test_an_alert_sink_is_one_file(tmp_path: Path) -> None:
    root = _copy(tmp_path, "actions/alerts/file.py", SINK)
    out = tmp_path / "alerts.txt"
    code = f"""
        import asyncio, os
        os.environ["HELLO_SINK_FILE"] = {str(out)!r}
        from rankwatch.actions.alerts import sinks_from_config
        from rankwatch.actions.alerts.message import AlertMember, AlertMessage
        from rankwatch.config.schema import AlertsConfig
        from rankwatch.records import Severity

        (sink,) = sinks_from_config(AlertsConfig())
        member = AlertMember(rank=3, message="loss is NaN")
        msg = AlertMessage("ext", "nan_loss", Severity.CRITICAL, "firing", [member], node="n")
        asyncio.run(sink.send(msg))
    """
    res = _run(root, code=code)
    assert res.returncode == 0, res.stderr
    assert "nan_loss" in out.read_text() and "3" in out.read_text(), out.read_text()


SOURCE = '''
    """A throwaway polled source: the load average, one file."""
    from __future__ import annotations

    import os
    from typing import Any, ClassVar

    from rankwatch.events import Event
    from rankwatch.sources.polled import SourceContext, register_source


    @register_source
    class LoadAverage:
        name: ClassVar[str] = "loadavg"
        interval = 1.0
        timeout = 1.0

        @classmethod
        def create(cls, ctx: SourceContext) -> LoadAverage:
            return cls()

        def inputs(self) -> Any:
            return None

        def sample(self, inputs: Any) -> list[Event]:
            os.getloadavg()
            return []
'''


def test_a_polled_source_is_one_file(tmp_path: Path) -> None:
    root = _copy(tmp_path, "sources/polled/loadavg.py", SOURCE)
    code = """
        from rankwatch.config.schema import Config
        from rankwatch.sources.polled import SourceContext, build_sources

        srcs = build_sources(SourceContext(Config(), lambda: {}))
        print([s.name for s in srcs])
        (load,) = [s for s in srcs if s.name == "loadavg"]
        print(load.sample(load.inputs()))
    """
    res = _run(root, code=code)
    assert res.returncode == 0, res.stderr
    assert "'loadavg'" in res.stdout.splitlines()[0] and res.stdout.splitlines()[1] == "[]", res.stdout
