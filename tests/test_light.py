"""The agent loads only what its configuration uses (issue 30, "Light").

Every module an agent imports stays in its memory for its lifetime: on a node of many
ranks, one per rank. A configuration without Slack, GPUs, a checkpoint folder or a
followed log must not pay for slack-sdk, pynvml, watchdog or the checkpoint verifiers;
the figures are in bench/bench_gpu_exporters.py. What the idle agent no longer does at each
period is guarded beside the code that does it: no walk over every process on the node
(tests/test_pidtable.py), no thread started per periodic call (tests/test_offloop.py).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import free_port, wait_for

# Modules a plain `watch --pid` agent with the GPU off must not import, with what needs them.
NOT_LOADED = {
    "slack_sdk": "alerts.slack set",
    "watchdog": "logs.watch or checkpoints.dir",
    "pynvml": "gpu.enabled",
    "multiprocessing": "rankwatch analyze with several files",
    "zipfile": "checkpoint verification",
    "rankwatch.checkpoints.catalog": "checkpoints.dir or the checkpoints command",
    "rankwatch.checkpoints.watcher": "checkpoints.dir",
    "rankwatch.server.page": "the status page's first visit",
    "rankwatch.dumps.flight": "dumps diff",
    "rankwatch.actions.alerts.dispatcher": "an alert sink",
    "difflib": "a config key that is not known",
    "rankwatch.dumps.cli": "the dumps command",
    "rankwatch.report": "the report command or an incident page",
    "rankwatch.checkpoints.cli": "the checkpoints command",
    "rankwatch.analyze": "the analyze command",
    "rankwatch.top": "the top command",
    "rankwatch.demo": "the demo command",
    "rankwatch.completion": "the completion command",
    "rankwatch.config.render": "config show",
    "rankwatch.k8s.node": "kubernetes node mode (watch --k8s)",
    "rankwatch.runtime.podwatch": "kubernetes node mode (watch --k8s)",
    "grpc": "kubernetes node mode (the kubelet's pod-resources API)",
    "statistics": "nothing: records.median (statistics loads decimal and fractions)",
    "decimal": "a size with a unit in a config file",
    "rankwatch.actions.alerts.message": "an alert sink",
    "rankwatch.actions.alerts._slack": "alerts.slack set",
    "rankwatch.actions.alerts._webhook": "alerts.webhook.urls set",
    "rankwatch.actions.alerts._alertmanager": "alerts.alertmanager.urls set",
    "rankwatch.actions.alerts.threads": "alerts.slack set",
    "rankwatch.dumps.classify": "a stall's or a profile's stacks",
    "rankwatch.dumps.diff": "a stall's stacks",
    "rankwatch.dumps.show": "a dump taken",
    "rankwatch.k8s.crilog": "kubernetes node mode",
    "rankwatch.runtime.diagnose": "ranks of a job of more than one (world size > 1)",
    "pkgutil": "nothing: each plugin family lists its folder (config.settings.plugin_modules)",
    "rankwatch.server.webconfig": "server.web_config set (TLS, basic auth)",
}


@pytest.mark.unit
def test_the_cross_rank_diagnosis_is_made_once_the_agent_has_peers(tmp_path: Path) -> None:
    """An agent of one rank holds no finding and records no exit (runtime/diagnose.py returns
    at once for it), so it gets a stand-in; a second watched rank makes the real one."""
    from rankwatch.config.loader import load_config
    from rankwatch.identity import Identity
    from rankwatch.records import Finding, Severity
    from rankwatch.runtime.agent import Agent
    from rankwatch.runtime.diagnose import CrossRank
    from rankwatch.runtime.judge import CrossRankWhenPeers

    cfg_path = tmp_path / "rw.yaml"
    cfg_path.write_text(f"dumps: {{dir: {tmp_path / 'dumps'}}}\n")
    cfg = load_config(str(cfg_path))
    agent = Agent(cfg, Identity("job", None, None, None, "n"), sinks=[])
    judge = CrossRankWhenPeers(agent, cfg)
    stall = Finding(kind="stall", severity=Severity.CRITICAL, rank=0, message="no progress")
    assert not judge.hold(stall)
    judge.clean_exit(0, 5, 1000.0)
    assert judge.judge is None and not (tmp_path / "dumps").exists()
    agent.watchers.extend([object(), object()])  # a launcher's two workers, attached later
    assert not judge.hold(Finding(kind="loss_plateau", severity=Severity.INFO, rank=0, message="flat"))
    assert isinstance(judge.judge, CrossRank)
    many = Agent(cfg, Identity("job", 1, 1, 4, "n"), sinks=[])
    assert isinstance(CrossRankWhenPeers(many, cfg).judge, CrossRank)  # a job of 4: at once


def _imported(stderr: str) -> set[str]:
    """Module names from ``python -X importtime``'s report (one line per import)."""
    out: set[str] = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            out.add(line.rsplit("|", 1)[1].strip())
    return out


def _served(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return b"rankwatch_" in r.read()
    except OSError:
        return False


@pytest.mark.process
def test_an_agent_without_gpu_logs_checkpoints_or_slack_imports_none_of_them(tmp_path: Path) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(f"gpu: {{enabled: false}}\ndumps: {{dir: {tmp_path / 'dumps'}}}\n")
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    port = free_port()
    cmd = [sys.executable, "-X", "importtime", "-m", "rankwatch", "watch", "--config", str(cfg),
           "--pid", str(rank.pid), "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "SLACK_"))}
    agent = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        wait_for(lambda: _served(port) or agent.poll() is not None, timeout=60, what="the agent serving")
        assert agent.poll() is None, "the agent exited"
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=30)
    finally:
        for p in (agent, rank):
            if p.poll() is None:
                p.kill()
                p.wait()
    mods = _imported(err)
    # The report is read right: the agent's server and its services are in it.
    assert {"aiohttp", "prometheus_client", "rankwatch.runtime.services", "rankwatch.server.app"} <= mods
    loaded = {m: why for m, why in NOT_LOADED.items() if m in mods}
    assert not loaded, f"imported although their feature is off: {loaded}"


@pytest.mark.process
def test_an_agent_following_its_childs_log_imports_no_folder_watch(tmp_path: Path) -> None:
    """Each log is read every ``logs.poll_interval``; a folder watch (watchdog, an observer and
    two inotify threads per log) is loaded only when ``logs.watch`` asks for one."""
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"gpu: {{enabled: false}}\ndumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}}}\n"
    )
    port = free_port()
    child = "import time; print('step=1 loss=2.5', flush=True); time.sleep(600)"
    cmd = [sys.executable, "-X", "importtime", "-m", "rankwatch", "run", "--config", str(cfg),
           "--listen", f"127.0.0.1:{port}", "--", sys.executable, "-c", child]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "SLACK_"))}
    agent = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path
    )
    try:
        wait_for(
            lambda: "rankwatch_log_lines_total{" in _metrics(port) or agent.poll() is not None,
            timeout=60,
            what="the child's log line counted",
        )
        assert agent.poll() is None, "the agent exited"
        agent.send_signal(signal.SIGTERM)  # run mode ends the job it started
        _, err = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    mods = _imported(err)
    assert "rankwatch.sources.follower" in mods and "watchdog" not in mods


@pytest.mark.process
def test_the_config_schema_loads_the_sinks_settings_but_no_network_stack() -> None:
    """The schema imports the sink modules for their settings (config/settings.py), so
    `rankwatch analyze` and `config check` load them too: a sink imports aiohttp, asyncio and
    slack-sdk when it first delivers, not when its module is imported."""
    code = "import sys, rankwatch.config.schema; print(' '.join(sorted(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    mods = set(res.stdout.split())
    assert {"rankwatch.actions.alerts.slack", "rankwatch.actions.alerts.webhook"} <= mods, res.stderr[-2000:]
    assert not {"asyncio", "aiohttp", "slack_sdk"} & mods
    # ... and the settings only: the sinks' code is imported by a builder that builds one.
    assert not {"rankwatch.actions.alerts._slack", "rankwatch.actions.alerts.message"} & mods


def _metrics(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


@pytest.mark.process
def test_every_thread_of_the_idle_agent_runs_at_its_lowered_priority(tmp_path: Path) -> None:
    """Threads are kept between periodic calls (offloop.start), and Linux keeps a nice value
    per thread: none may keep the priority the agent had before ``process.agent_nice``."""
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"gpu: {{enabled: false}}\ndumps: {{dir: {tmp_path / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp_path / 'logs'}}}\nprocess: {{agent_nice: 7, sample_interval: 0.2s}}\n"
    )
    port = free_port()
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--listen", f"127.0.0.1:{port}",
           "--", sys.executable, "-c", "import time; time.sleep(600)"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "SLACK_"))}
    agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path)
    try:
        # Several process samples and a descendants' walk (every 5 samples, at least 1 s) done.
        wait_for(
            lambda: "rankwatch_process_up{" in _metrics(port) or agent.poll() is not None,
            timeout=60,
            what="a process sample served",
        )
        assert agent.poll() is None, "the agent exited"
        base = int(Path(f"/proc/{agent.pid}/stat").read_text().rsplit(")", 1)[1].split()[16])

        def nices() -> dict[int, int]:
            out: dict[int, int] = {}
            for task in Path(f"/proc/{agent.pid}/task").iterdir():
                try:
                    out[int(task.name)] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
                except (OSError, ValueError):
                    pass  # a thread that ended while we looked
            return out

        seen = nices()
        assert len(seen) > 1 and base == 7
        assert {t: n for t, n in seen.items() if n != 7} == {}
    finally:
        job = psutil.Process(agent.pid).children(recursive=True) if agent.poll() is None else []
        agent.send_signal(signal.SIGTERM)  # run mode ends the job it started
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        for p in job:
            with contextlib.suppress(psutil.Error):
                p.kill()


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


@pytest.mark.unit
def test_live_commands_build_no_parser_of_the_package_subcommands() -> None:
    """Building the dumps, report and checkpoints parsers imports those packages, which an
    agent would then keep for its lifetime: ``run`` and ``watch`` build only their own."""
    from rankwatch.cli import PACKAGE_COMMANDS, build_parser, command_of

    assert command_of(["-v", "run", "--", "python", "train.py"]) == "run"
    assert command_of(["--version"]) is None
    for argv in (["run", "--", "python", "-c", "pass"], ["-q", "watch", "--pid", "1"], ["analyze", "x.log"]):
        assert not _subcommands(build_parser(command_of(argv))) & set(PACKAGE_COMMANDS)
    # Their own commands, --help, no command and a typo (argparse lists every choice) get all.
    for argv in (["dumps", "list"], ["-v", "report", "x"], ["checkpoints", "verify"], ["-h"], [], ["dump"]):
        assert set(PACKAGE_COMMANDS) <= _subcommands(build_parser(command_of(argv)))


@pytest.mark.unit
def test_package_subcommands_still_parse_through_main(capsys: pytest.CaptureFixture[str]) -> None:
    from rankwatch.cli import main

    with pytest.raises(SystemExit) as e:
        main(["dumps", "list", "--help"])
    assert e.value.code == 0 and "usage: rankwatch dumps list" in capsys.readouterr().out


@pytest.mark.unit
def test_dumps_package_names_resolve_on_first_use() -> None:
    import rankwatch.dumps as dumps
    from rankwatch.dumps.diff import format_diff
    from rankwatch.dumps.store import DumpStore

    assert dumps.format_diff is format_diff and dumps.DumpStore is DumpStore
    assert all(getattr(dumps, name) is not None for name in dumps.__all__)
    with pytest.raises(AttributeError):
        _ = dumps.no_such_name


@pytest.mark.unit
def test_release_startup_memory_is_safe_to_call_again() -> None:
    from rankwatch.cli import release_startup_memory

    release_startup_memory()
    release_startup_memory()
