"""The ``rankwatch`` command line as operators use it: fail-open sidecars, help text, --json,
progress on a terminal, shell completion."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import agent_token

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKWATCH_", "SLURM_"))}
    env["PYTHONPATH"] = str(ROOT / "agent")
    env.update(extra)
    return env


def _rankwatch(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rankwatch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=kw.pop("env", None) or _env(),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


# --- watch --fail-open --------------------------------------------------------------------


def _start_fail_open(tmp_path: Path, config: str, *extra: str) -> tuple[subprocess.Popen[str], int, Path]:
    cfg = tmp_path / "rankwatch.yaml"
    cfg.write_text(config)
    err = tmp_path / "stderr.txt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "watch", "--fail-open", "--config", str(cfg), *extra],
        stdout=subprocess.DEVNULL,
        stderr=err.open("w"),
        text=True,
        env=_env(RANK="3"),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"serving /healthz.* on [^\s]+:(\d+)", err.read_text())
        if m:
            return proc, int(m.group(1)), err
        assert proc.poll() is None, err.read_text()
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no fail-open server: {err.read_text()}")


@pytest.mark.process
def test_config_typo_without_fail_open_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text("stall:\n  startup_grase: 10m\n")
    proc = _rankwatch("watch", "--config", str(cfg), "--match", "train.py")
    assert proc.returncode == 2
    assert "startup_grase" in proc.stderr


@pytest.mark.process
@pytest.mark.parametrize(
    ("config", "extra", "reason"),
    [
        ("stall:\n  startup_grase: 10m\nserver:\n  listen: 127.0.0.1:0\n", ("--match", "x"), "config_error"),
        (
            "server:\n  token: ${RANKWATCH_TOKEN}\n",
            ("--match", "x", "--listen", "127.0.0.1:0"),
            "config_error",
        ),
        ("{}\n", ("--match", "(", "--listen", "127.0.0.1:0"), "usage_error"),
    ],
)
def test_fail_open_stays_up_unready_and_says_why(
    tmp_path: Path, config: str, extra: tuple[str, ...], reason: str
) -> None:
    proc, port, err = _start_fail_open(tmp_path, config, *extra)
    try:
        base = f"http://127.0.0.1:{port}"
        assert _get(f"{base}/healthz")[0] == 200  # a liveness probe must not restart it into the error
        status, body = _get(f"{base}/readyz")
        assert status == 503 and "not watching" in body
        status, metrics = _get(f"{base}/metrics")
        assert status == 200
        assert re.search(rf'rankwatch_agent_degraded\{{reason="{reason}".*rank="3".*\}} 1', metrics), metrics
        text = err.read_text()
        assert "NOT watched" in text and reason in text
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.mark.tool
def test_degraded_metrics_pass_promtool(tmp_path: Path) -> None:
    import shutil

    from rankwatch.runtime.failopen import metrics_text

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    text = metrics_text("config_error", {"run": "r", "rank": "0", "node": "n"})
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- an agent that cannot read the ranks' environment -----------------------------------------


@pytest.mark.process
def test_unreadable_rank_environment_is_loud_and_not_ready(tmp_path: Path) -> None:
    """Several ranks per pod, the sidecar as another user than the trainers: it sees the
    processes but not their RANK. It must say so (log, metric, /readyz 503), not sit ready
    and silent with nothing attached. Here the rank runs as nobody and the agent as root
    stripped of every capability, which is what reading /proc/PID/environ then needs."""
    import shutil

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv (util-linux) to run the rank as another user")
    marker = f"3{os.getpid() % 100:02d}"
    rank = subprocess.Popen(
        [setpriv, "--reuid", "65534", "--regid", "65534", "--clear-groups", "/bin/sleep", f"{marker}.5"],
        env={"RANK": "5", "LOCAL_RANK": "0", "PATH": "/usr/bin:/bin"},
    )
    err = tmp_path / "stderr"
    logs = [tmp_path / "rank-5.log", tmp_path / "rank-6.log"]
    for p in logs:
        p.write_text("")
    agent = subprocess.Popen(
        [
            setpriv, "--inh-caps", "-all", "--ambient-caps", "-all", "--bounding-set", "-all", "--",
            sys.executable, "-m", "rankwatch", "-v", "watch", "--match", rf"^/bin/sleep {marker}\.5$",
            "--log", str(logs[0]), "--log", str(logs[1]), "--listen", "127.0.0.1:0",
            "--dumps-dir", str(tmp_path / "dumps"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=err.open("w"),
        env=_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        port = None
        while time.monotonic() < deadline and port is None:
            assert agent.poll() is None, err.read_text()
            m = re.search(r"serving metrics and API on [^\s]+:(\d+)", err.read_text())
            port = m and int(m.group(1))
            time.sleep(0.05)
        assert port, err.read_text()
        base = f"http://127.0.0.1:{port}"
        while time.monotonic() < deadline:
            status, body = _get(f"{base}/readyz", agent_token())  # details need the token
            if "cannot read the environment" in body:
                break
            time.sleep(0.1)
        assert status == 503, body
        assert f"pid {rank.pid}" in body and "UID 65534" in body
        assert f"cannot read the environment of pid {rank.pid}" in err.read_text()
        _, metrics = _get(f"{base}/metrics")
        assert re.search(r'rankwatch_internal_errors_total\{[^}]*component="process_env"[^}]*\} 1', metrics)
        assert err.read_text().count("cannot read the environment") == 1  # once, not every poll
    finally:
        agent.terminate()
        rank.kill()
        agent.wait(timeout=20)
        rank.wait(timeout=20)


# --- help, --json, colour -------------------------------------------------------------------

# dumps/cli.py belongs to the dumps work; its options are documented there.
HELP_PENDING: set[str] = set()


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from rankwatch.cli import build_parser

    out = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        out.append((path, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, f"{path} {name}")

    walk(build_parser(), "rankwatch")
    return out


@pytest.mark.unit
def test_every_option_and_command_has_help() -> None:
    missing = set()
    for path, p in _parsers():
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for choice in a._choices_actions:
                    if not choice.help:
                        missing.add(f"{path} {choice.dest}")
            elif not a.help:
                missing.add(f"{path} {a.option_strings[-1] if a.option_strings else a.dest}")
    assert missing - HELP_PENDING == set(), sorted(missing - HELP_PENDING)


@pytest.mark.unit
def test_help_names_nothing_unshipped_and_watch_has_a_description() -> None:
    parsers = dict(_parsers())
    for path, p in parsers.items():
        assert "DESIGN.md" not in p.format_help(), path
    assert parsers["rankwatch watch"].description
    assert "--fail-open" in parsers["rankwatch watch"].format_help()


@pytest.mark.process
def test_config_show_json_is_the_effective_config_without_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        "server:\n  token: ${RANKWATCH_TOKEN}\n"
        "alerts:\n  webhook:\n    urls: [https://h]\n    headers:\n      Authorization: Bearer ${HOOK}\n"
        "detectors:\n  warmup_steps: 7\n"
    )
    proc = _rankwatch(
        "config", "show", "--json", "--config", str(cfg), env=_env(RANKWATCH_TOKEN="s3cret", HOOK="h00k")
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["detectors"]["warmup_steps"] == 7 and doc["stall"]["startup_grace"] == 900.0
    assert doc["server"]["token"] == "${RANKWATCH_TOKEN}"
    assert doc["alerts"]["webhook"]["headers"] == {"Authorization": "<redacted>"}
    assert "s3cret" not in proc.stdout and "h00k" not in proc.stdout


@pytest.mark.unit
@pytest.mark.parametrize(("no_color", "coloured"), [(None, True), ("1", False), ("", True)])
def test_live_console_honours_no_color(
    monkeypatch: pytest.MonkeyPatch, no_color: str | None, coloured: bool
) -> None:
    import io

    from rankwatch.actions.console import ConsoleSink
    from rankwatch.identity import Identity
    from rankwatch.records import Finding, Severity

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    out = Tty()
    ConsoleSink(Identity("r", 0, 0, 1, "n"), stream=out).send(Finding("stall", Severity.CRITICAL, 0, "hung"))
    assert ("\x1b[" in out.getvalue()) is coloured, out.getvalue()


# --- shell completion ---------------------------------------------------------------------------


def _bash_complete(script: Path, *words: str) -> list[str]:
    cmd = (
        f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
        'COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _rankwatch_complete; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


@pytest.mark.process
def test_bash_completion(tmp_path: Path) -> None:
    proc = _rankwatch("completion", "bash")
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "rankwatch.bash"
    script.write_text(proc.stdout)
    assert subprocess.run(["bash", "-n", str(script)], timeout=30).returncode == 0
    assert set(_bash_complete(script, "rankwatch", "")) >= {"analyze", "run", "watch", "dumps", "completion"}
    assert _bash_complete(script, "rankwatch", "con") == ["config"]
    assert _bash_complete(script, "rankwatch", "-v", "dumps", "d") == ["diff"]
    assert set(_bash_complete(script, "rankwatch", "analyze", "--j")) == {"--jobs", "--json"}
    assert "--fail-open" in _bash_complete(script, "rankwatch", "watch", "--f")
    # an option's value is a file, and does not count as a subcommand
    assert _bash_complete(script, "rankwatch", "analyze", "--config", str(script)[:-3]) == [str(script)]
    assert _bash_complete(script, "rankwatch", "completion", "") == ["bash", "zsh"]


@pytest.mark.tool
def test_zsh_completion(tmp_path: Path) -> None:
    import shutil

    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.skip("zsh not installed (Debian: apt-get install -y zsh)")
    proc = _rankwatch("completion", "zsh")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#compdef rankwatch\n")
    script = tmp_path / "_rankwatch"
    script.write_text(proc.stdout)
    check = (
        f"autoload -U compinit && compinit -u -D; source {script}; "
        "COMP_WORDS=(rankwatch config ''); COMP_CWORD=2; "
        'emulate sh -c "setopt ksharrays; _rankwatch_complete"; print -rl -- "${COMPREPLY[@]}"'
    )
    out = subprocess.run([zsh, "-f", "-c", check], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["check", "show"], out.stdout + out.stderr


# --- analyze progress ---------------------------------------------------------------------------


@pytest.mark.unit
def test_progress_line_renders_bytes_and_never_claims_done_early() -> None:
    from rankwatch.progress import render

    assert render(412 << 20, 1 << 30, 12.4) == "analyze: 412.0 MiB of 1.0 GiB (40%), 12 s"
    assert "(99%)" in render(1 << 30, 1 << 30, 3)  # read, but not yet analysed
    assert "(0%)" in render(0, 0, 0)


@pytest.mark.unit
def test_progress_draws_then_erases_itself(tmp_path: Path) -> None:
    import io

    from rankwatch.progress import Progress

    log = tmp_path / "rank-0.log"
    log.write_bytes(b"x" * 1000)
    now = [0.0]
    out = io.StringIO()
    prog = Progress([str(log)], out, read_bytes=lambda: 250, delay=0, interval=3600, clock=lambda: now[0])
    now[0] = 2.0
    prog.frame()
    assert out.getvalue() == "\r\x1b[Kanalyze: 250 B of 1000 B (25%), 2 s"
    with prog:
        pass
    assert out.getvalue().endswith("\r\x1b[K")


def _run_in_pty(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run rankwatch with stderr on a pseudo-terminal and stdout on a pipe."""
    import pty

    main, child = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rankwatch", *args],
            stdout=subprocess.PIPE, stderr=child, stdin=subprocess.DEVNULL, env=env, timeout=60,
        )  # fmt: skip
        os.close(child)
        child = -1
        chunks = []
        while True:
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not data:
                break
            chunks.append(data)
        return proc.returncode, proc.stdout.decode(), b"".join(chunks).decode(errors="replace")
    finally:
        if child >= 0:
            os.close(child)
        os.close(main)


@pytest.mark.process
@pytest.mark.parametrize(
    ("argv", "shown"),
    [(["analyze"], True), (["analyze", "--quiet"], False), (["-q", "analyze"], False)],
)
def test_analyze_shows_progress_on_a_terminal_only(tmp_path: Path, argv: list[str], shown: bool) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("".join(f"step={i} loss={2.0 - i / 10000:.4f} lr=0.0003\n" for i in range(1, 3000)))
    env = _env(RANKWATCH_PROGRESS_DELAY="0")
    rc, out, err = _run_in_pty([*argv, str(log)], env)
    assert rc == 0, err
    assert ("analyze: " in err) is shown, repr(err)
    if shown:
        assert err.rstrip("\r\n").endswith("\x1b[K"), repr(err[-40:])  # erased at the end
        assert "analyze: " not in out
    # Not a terminal: never.
    piped = _rankwatch(*argv, str(log), env=env)
    assert piped.returncode == 0 and "analyze: " not in piped.stderr and "\r" not in piped.stderr


@pytest.mark.unit
def test_pyproject_declares_the_supported_pythons_and_project_urls() -> None:
    setuptools_config = pytest.importorskip("setuptools.config.pyprojecttoml")
    project = setuptools_config.read_configuration(ROOT / "pyproject.toml")["project"]
    assert project["requires-python"] == ">=3.10"
    versions = {
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if c.startswith("Programming Language :: Python :: 3.")
    }
    assert {"3.10", "3.13"} <= versions
    # .ci/run smoke-tests the oldest and the newest classifier version.
    ci = (ROOT / ".ci" / "run").read_text()
    oldest, newest = (
        min(versions, key=lambda v: tuple(map(int, v.split(".")))),
        max(versions, key=lambda v: tuple(map(int, v.split(".")))),
    )
    assert f"for v in {oldest} {newest}; do" in ci
    assert {"Homepage", "Source", "Issues"} <= set(project["urls"])
