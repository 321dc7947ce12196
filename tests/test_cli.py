"""The ``rankwatch`` command line as operators use it: fail-open sidecars, help text, --json,
progress on a terminal, shell completion."""

from __future__ import annotations

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


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
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


def test_config_typo_without_fail_open_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text("stall:\n  startup_grase: 10m\n")
    proc = _rankwatch("watch", "--config", str(cfg), "--match", "train.py")
    assert proc.returncode == 2
    assert "startup_grase" in proc.stderr


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
            status, body = _get(f"{base}/readyz")
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
