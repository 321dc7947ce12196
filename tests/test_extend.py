"""Adding a log format, a detector, a polled source, a metric collector or an alert sink is
one file.

Each test copies the package into a temporary folder, adds one throwaway plugin file there
(and nothing else), and runs the real program from that copy in a child process, which shows
the plugin found, built and used: a format detected and chosen by ``logs.format``, a
detector's finding in ``analyze``, a collector's series in a scrape of the agent's registry,
a sink's delivery, a source's events. The files are the code blocks of README's Development
section (each after an ``<!-- extend: <path> -->`` line), so what the README shows is what
runs here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "agent" / "rankwatch"


def _readme_plugins() -> dict[str, str]:
    """``{path in the package: code}`` of README's plugin examples."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"<!-- extend: (\S+) -->\n *```python\n(.*?)\n *```", readme, re.S)
    return {path: textwrap.dedent(code) + "\n" for path, code in blocks}


PLUGINS = _readme_plugins()


def test_the_readme_shows_one_plugin_of_each_kind() -> None:
    kinds = {"sources/parsers", "detectors", "sources/polled", "exporter", "actions/alerts"}
    assert {path.rpartition("/")[0] for path in PLUGINS} == kinds, sorted(PLUGINS)


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


def test_a_detector_is_one_file(tmp_path: Path) -> None:
    root = _copy(tmp_path, "detectors/big_loss.py", PLUGINS["detectors/big_loss.py"])
    log = tmp_path / "train.log"
    log.write_text("".join(f"step={i} loss={2.0 if i != 7 else 150.0}\n" for i in range(1, 12)))
    res = _run(root, "analyze", "--json", str(log))
    doc = json.loads(res.stdout)
    big = [f for f in doc["findings"] if f["kind"] == "big_loss"]
    assert [(f["step"], f["severity"]) for f in big] == [(7, "warning")], res.stdout + res.stderr
    assert res.returncode == 1
    res = _run(root, "analyze", "--json", "--set", "detectors.big_loss.ceiling=200", str(log))
    assert not [f for f in json.loads(res.stdout)["findings"] if f["kind"] == "big_loss"], res.stdout
    shown = _run(root, "config", "show").stdout
    assert "big_loss:" in shown and "ceiling: 100.0" in shown, shown[-3000:]


def test_a_metric_collector_is_one_file(tmp_path: Path) -> None:
    root = _copy(tmp_path, "exporter/hello.py", PLUGINS["exporter/hello.py"])
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


def test_an_alert_sink_is_one_file(tmp_path: Path) -> None:
    """The sink is built from its own settings (alerts.file.path), which the loader takes and
    checks with the key named, and which the Helm values schema generated from that copy lists."""
    root = _copy(tmp_path, "actions/alerts/file.py", PLUGINS["actions/alerts/file.py"])
    out = tmp_path / "alerts.txt"
    code = f"""
        import asyncio, importlib.util, json
        from rankwatch.actions.alerts import sinks_from_config
        from rankwatch.actions.alerts.message import AlertMember, AlertMessage
        from rankwatch.config.loader import ConfigError, config_from_yaml
        from rankwatch.config.schema import Config
        from rankwatch.records import Severity

        assert sinks_from_config(Config().alerts) == []
        cfg = config_from_yaml("alerts:\\n  file:\\n    path: {out}\\n")
        (sink,) = sinks_from_config(cfg.alerts)
        member = AlertMember(rank=3, message="loss is NaN")
        msg = AlertMessage("ext", "nan_loss", Severity.CRITICAL, "firing", [member], node="n")
        asyncio.run(sink.send(msg))
        try:
            config_from_yaml("alerts:\\n  file:\\n    paht: x\\n")
        except ConfigError as e:
            print("refused:", e)
        spec = importlib.util.spec_from_file_location("gen", {str(ROOT / "helm" / "gen_values_schema.py")!r})
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        alerts = gen.config_schema()["properties"]["alerts"]["properties"]
        print("helm:", json.dumps(sorted(alerts["file"]["properties"])))
    """
    res = _run(root, code=code)
    assert res.returncode == 0, res.stderr
    assert "nan_loss" in out.read_text() and "3" in out.read_text(), out.read_text()
    assert "alerts.file.paht: unknown key (did you mean 'path'?)" in res.stdout, res.stdout
    assert 'helm: ["path"]' in res.stdout, res.stdout


def test_a_sinks_credentials_are_declared_beside_its_code(tmp_path: Path) -> None:
    """A sink's settings mark its secret and its URL: with no line in the loader or the
    renderer, a literal key is warned about, ``config show`` (YAML and JSON) prints the
    ``${VAR}`` and the URL without its credentials, and the Helm values schema asks for a
    reference."""
    root = _copy(tmp_path, "actions/alerts/pager.py", PLUGINS["actions/alerts/pager.py"])
    code = f"""
        import dataclasses, importlib.util, json, logging, sys
        from rankwatch.actions.alerts import sinks_from_config
        from rankwatch.config.loader import config_from_yaml
        from rankwatch.config.render import redacted, render_config

        logging.basicConfig(stream=sys.stdout, format="warn: %(message)s")
        url = "https://ops:hunter2@pager.example/v2/enqueue"
        text = f"alerts:\\n  pager:\\n    url: {{url}}\\n    key: R0UT1NGK3Y\\n"
        cfg = config_from_yaml(text, source="p.yaml", env={{}})
        (sink,) = sinks_from_config(cfg.alerts)
        assert sink.key == "R0UT1NGK3Y"
        shown = render_config(cfg).splitlines()
        at = shown.index("  pager:")
        print("show:", json.dumps(shown[at : at + 3]))
        print("json:", json.dumps(dataclasses.asdict(redacted(cfg))["alerts"]["pager"], default=str))
        spec = importlib.util.spec_from_file_location("gen", {str(ROOT / "helm" / "gen_values_schema.py")!r})
        gen = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(gen)
        pager = gen.config_schema()["properties"]["alerts"]["properties"]["pager"]["properties"]
        print("helm:", json.dumps(pager["key"]))
    """
    res = _run(root, code=code)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "p.yaml:4: alerts.pager.key holds a literal secret; write ${PAGER_KEY}" in out, out
    assert "p.yaml:3: alerts.pager.url holds a credential in its URL" in out, out
    shown = json.loads(next(line for line in out.splitlines() if line.startswith("show:"))[5:])
    assert shown[1].startswith("    url: https://<redacted>@pager.example/v2/enqueue  #"), shown
    assert shown[2].startswith("    key: ${PAGER_KEY}  #"), shown
    assert "R0UT1NGK3Y" not in out and "hunter2" not in out, out
    as_json = json.loads(next(line for line in out.splitlines() if line.startswith("json:"))[5:])
    assert as_json["key"] == "${PAGER_KEY}" and as_json["url"].startswith("https://<redacted>@pager.example")
    assert "a secret: write ${PAGER_KEY}" in out.split("helm:", 1)[1], out


def test_a_polled_source_is_one_file(tmp_path: Path) -> None:
    root = _copy(tmp_path, "sources/polled/loadavg.py", PLUGINS["sources/polled/loadavg.py"])
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


WOKEN_SOURCE = """
    \"\"\"A source woken between its periods: a thread of its own says when there is news.\"\"\"
    from __future__ import annotations

    import os
    import threading
    import time
    from collections.abc import Callable
    from typing import Any

    from rankwatch.events import Event, Tick
    from rankwatch.sources.polled import SourceContext, register_source


    @register_source
    class Flag:
        name = "flag"
        scope = "ranks"  # every watched rank's engine gets its events
        interval = 3600.0  # the period is the safety net: news comes through wake()
        timeout = 5.0
        min_gap = 0.0

        @classmethod
        def create(cls, ctx: SourceContext) -> Flag | None:
            return cls() if os.environ.get("FLAG_FILE") else None

        def bind(self, wake: Callable[[], None]) -> None:
            def watch() -> None:
                while not os.path.exists(os.environ["FLAG_FILE"]):
                    time.sleep(0.01)
                wake()

            threading.Thread(target=watch, daemon=True).start()

        def inputs(self) -> Any:
            return None

        def sample(self, inputs: Any) -> list[Event]:
            return [Tick(0.0, time.time())]

        def close(self) -> None:
            print("closed", flush=True)
"""


def test_a_woken_source_is_one_file(tmp_path: Path) -> None:
    """A source of another kind (woken early, every rank's, with a close) runs in a live agent
    under the same policy, from its file alone."""
    root = _copy(tmp_path, "sources/polled/flag.py", WOKEN_SOURCE)
    flag = tmp_path / "go"
    code = f"""
        import asyncio, os, time
        from pathlib import Path
        from rankwatch.config.loader import config_from_yaml
        from rankwatch.identity import Identity
        from rankwatch.runtime.agent import Agent
        from rankwatch.runtime.services import Services

        os.environ["FLAG_FILE"] = {str(flag)!r}
        cfg = config_from_yaml("gpu:\\n  enabled: false\\nserver:\\n  enabled: false\\n")
        agent = Agent(cfg, Identity(run="ext", rank=0, local_rank=0, world_size=1, node="n"))
        agent.add_watcher([Path("rank-0.log").resolve()])

        async def main():
            svc = Services(agent, cfg, server=False)
            await svc.start()
            seen = []

            async def samples(n):  # each sample is a new tuple in agent.sampled
                for _ in range(500):
                    now = agent.sampled.get("flag")
                    if now is not None and (not seen or now is not seen[-1]):
                        seen.append(now)
                    if len(seen) >= n:
                        return True
                    await asyncio.sleep(0.01)
                return False

            print("first", await samples(1))
            Path({str(flag)!r}).touch()
            print("woken", await samples(2))
            await svc.close(2.0)
            await asyncio.sleep(0.2)

        asyncio.run(main())
    """
    res = _run(root, code=code, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["first", "True", "woken", "True", "closed"], res.stdout + res.stderr


RANK_SOURCE = """
    \"\"\"A source made for each watched rank: it reads that rank's process as last attached.\"\"\"
    from __future__ import annotations

    import threading
    import time
    from typing import Any

    from rankwatch.events import Event, Tick
    from rankwatch.sources.polled import RankContext, register_source


    @register_source
    class OpenFiles:
        name = "open_files"
        scope = "rank"  # one per watched rank, made from a RankContext; its events to that rank
        when_stuck = "fail"  # a read of a process in D state: the next periods fail at once
        interval = 0.05
        timeout = 5.0

        def __init__(self, ctx: RankContext) -> None:
            self.ctx = ctx

        @classmethod
        def create(cls, ctx: RankContext) -> OpenFiles:
            return cls(ctx)

        @property
        def thread(self) -> str:
            return f"rankwatch-open-files-{self.ctx.rank}"

        def inputs(self) -> Any:
            return self.ctx.prober()  # None before the first attach and after the exit

        def sample(self, prober: Any) -> list[Event]:
            pid = prober.pid if prober is not None else None
            print("sampled", self.ctx.rank, threading.current_thread().name, pid, flush=True)
            return [Tick(0.0, time.time())]
"""


def test_a_source_of_each_rank_is_one_file(tmp_path: Path) -> None:
    """A source of scope ``"rank"`` is made for each watched rank and run by that rank's live
    pipeline, beside its process source, from its file alone: it samples the process the rank
    attached, on the thread it names, and its events reach that rank's engine."""
    root = _copy(tmp_path, "sources/polled/open_files.py", RANK_SOURCE)
    code = """
        import asyncio, os
        from pathlib import Path
        from rankwatch.config.schema import Config
        from rankwatch.identity import Identity
        from rankwatch.runtime.agent import Agent

        agent = Agent(Config(), Identity(run="ext", rank=3, local_rank=0, world_size=4, node="n"))
        w = agent.add_watcher([Path("rank-3.log").resolve()])
        print(sorted(w.pollers))
        w.attach(os.getpid())
        got = []
        w.push = lambda e: got.append(type(e).__name__) or []

        async def main():
            task = asyncio.create_task(w.run())
            for _ in range(500):
                if "Tick" in got:
                    break
                await asyncio.sleep(0.01)
            w.stop()
            await task
            print("delivered", "Tick" in got, os.getpid())

        asyncio.run(main())
    """
    res = _run(root, code=code, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    pid = lines[-1].split()[-1]
    assert lines[0] == "['logs', 'open_files', 'process']", res.stdout
    assert f"sampled 3 rankwatch-open-files-3 {pid}" in lines, res.stdout
    assert lines[-1] == f"delivered True {pid}", res.stdout + res.stderr


def test_a_log_format_is_one_file(tmp_path: Path) -> None:
    """Auto-detection finds the new format, ``logs.format`` and ``--format`` take its name (the
    config schema's choices come from the registry), and the real package refuses the name
    with the key and the known formats."""
    root = _copy(tmp_path, "sources/parsers/hello.py", PLUGINS["sources/parsers/hello.py"])
    log = tmp_path / "train.log"
    log.write_text("".join(f"[hello] step {i} loss {'nan' if i == 7 else 2.5}\n" for i in range(1, 12)))
    res = _run(root, "analyze", "--json", str(log))
    doc = json.loads(res.stdout)
    assert [(r["format"], r["steps"]) for r in doc["ranks"]] == [("hello", 11)], res.stdout + res.stderr
    assert [(f["kind"], f["step"]) for f in doc["findings"]] == [("nan_loss", 7)], res.stdout
    assert res.returncode == 1

    conf = tmp_path / "rankwatch.yaml"
    conf.write_text("logs:\n  format: hello\n")
    res = _run(root, "analyze", "--json", "--config", str(conf), str(log))
    assert [r["format"] for r in json.loads(res.stdout)["ranks"]] == ["hello"], res.stdout + res.stderr
    res = _run(root, "analyze", "--json", "--format", "hello", str(log))
    assert [r["format"] for r in json.loads(res.stdout)["ranks"]] == ["hello"], res.stdout + res.stderr
    assert _run(root, "config", "check", str(conf)).returncode == 0

    real = _run(PACKAGE.parent, "config", "check", str(conf))
    assert real.returncode == 2
    assert "logs.format: must be one of 'auto', 'megatron'" in real.stderr, real.stderr
    assert "'regex' (got 'hello')" in real.stderr, real.stderr
