"""The node-daemon unit: hardened, yet able to ptrace other users' training processes.

`systemd-analyze verify` checks the unit offline (no systemd PID 1 needed) but insists
that ExecStart's binary exists, so it runs on a copy whose ExecStart points at this
environment's `rankwatch`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "rankwatch.service"
ENV_EXAMPLE = ROOT / "systemd" / "rankwatch.env.example"
CONFIG_EXAMPLE = ROOT / "systemd" / "rankwatch.yaml.example"


def _unit() -> dict[str, list[tuple[str, str]]]:
    """Sections as ordered (key, value) lists: systemd keys may repeat, so configparser won't do."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections.setdefault(current, [])
            continue
        key, _, value = line.partition("=")
        sections[current].append((key.strip(), value.strip()))
    return sections


def _service() -> dict[str, str]:
    """Last assignment wins, as in systemd (for the single-valued keys checked here)."""
    return dict(_unit()["Service"])


def _all(key: str) -> list[str]:
    return [v for k, v in _unit()["Service"] if k == key]


def _env_file() -> dict[str, str]:
    out = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value
    return out


@pytest.mark.unit
def test_unit_sections() -> None:
    unit = _unit()
    assert set(unit) == {"Unit", "Service", "Install"}
    assert ("WantedBy", "multi-user.target") in unit["Install"]


@pytest.mark.unit
def test_unit_capabilities_allow_ptrace_and_nothing_more() -> None:
    svc = _service()
    bounding = set(svc["CapabilityBoundingSet"].split())
    assert bounding == {"CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"}
    ambient = set(svc["AmbientCapabilities"].split())
    assert "CAP_SYS_PTRACE" in ambient and ambient <= bounding
    assert svc["NoNewPrivileges"] == "yes"
    user = svc["User"]
    assert user and user not in {"root", "0"}, "a dedicated user; ptrace comes from the ambient capability"
    assert svc.get("DynamicUser", "no") == "no"


@pytest.mark.unit
def test_unit_filesystem_hardening() -> None:
    svc = _service()
    assert svc["ProtectSystem"] == "strict"
    assert svc["ProtectHome"] == "read-only"
    assert svc["PrivateTmp"] == "yes"
    assert svc.get("PrivateDevices", "no") == "no", "NVML needs /dev/nvidia*"
    assert svc.get("ProtectProc", "default") == "default", "invisible would hide the training processes"
    assert svc.get("PrivateUsers", "no") == "no", (
        "a user namespace voids CAP_SYS_PTRACE on the host's processes"
    )
    writable = svc["ReadWritePaths"].split()
    cfg = yaml.safe_load(CONFIG_EXAMPLE.read_text())
    for path in (cfg["dumps"]["dir"], cfg["alerts"]["spool_dir"]):
        assert any(Path(path).is_relative_to(w) for w in writable), f"{path} is read-only for the service"
    assert svc["WorkingDirectory"] in writable


@pytest.mark.unit
def test_unit_runs_watch_with_restart_and_secrets_from_the_env_file() -> None:
    svc = _service()
    assert svc["Type"] == "notify"  # started once watching: rankwatch.runtime.modes.notify_ready
    assert svc.get("NotifyAccess", "main") == "main"  # the agent itself says it is ready
    assert svc["Restart"] == "on-failure"
    assert svc["EnvironmentFile"] == "-/etc/rankwatch/rankwatch.env"
    argv = svc["ExecStart"].split()
    assert Path(argv[0]).name == "rankwatch" and argv[1] == "watch"
    assert argv[argv.index("--match") + 1] == "${RANKWATCH_MATCH}"
    assert argv[argv.index("--config") + 1] == "${RANKWATCH_CONFIG}"
    env = dict(v.strip('"').split("=", 1) for v in _all("Environment"))
    assert env["RANKWATCH_CONFIG"] == "/etc/rankwatch/rankwatch.yaml"
    for value in env.values():
        assert "\\" not in value, "systemd unescapes backslashes in Environment="


@pytest.mark.unit
def test_env_example_holds_the_secrets_and_a_working_match() -> None:
    env = _env_file()
    assert {"SLACK_BOT_TOKEN", "RANKWATCH_TOKEN", "RANKWATCH_MATCH"} <= set(env)
    cfg_text = CONFIG_EXAMPLE.read_text()
    for secret in ("SLACK_BOT_TOKEN", "RANKWATCH_TOKEN"):
        assert "${" + secret in cfg_text
    match = re.compile(env["RANKWATCH_MATCH"])
    assert match.search("/usr/bin/python3 -u train.py --lr 3e-4")
    assert match.search("python train.py")
    assert not match.search("bash -c python train.py | tee rank-0.log")
    assert not match.search("tee rank-0.log")


@pytest.mark.process
def test_config_example_passes_rankwatch_config_check() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "rankwatch", "config", "check", str(CONFIG_EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr


def _verifiable_copy(tmp_path: Path) -> Path:
    exe = shutil.which("rankwatch", path=str(Path(sys.executable).parent)) or shutil.which("rankwatch")
    if exe is None:
        pytest.skip("the rankwatch console script is not installed")
    text = UNIT.read_text()
    copy = tmp_path / UNIT.name
    copy.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={exe}", text, count=1, flags=re.M))
    return copy


@pytest.mark.tool
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    proc = subprocess.run(
        [analyze, "verify", "--man=no", str(_verifiable_copy(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Unknown keys and bad values are only warnings (exit 0): any output is a failure.
    assert proc.returncode == 0 and not proc.stderr.strip() and not proc.stdout.strip(), proc.stderr


@pytest.mark.tool
def test_systemd_analyze_security_exposure(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    proc = subprocess.run(
        [
            analyze,
            "security",
            "--offline=yes",
            "--threshold=50",
            "--no-pager",
            str(_verifiable_copy(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--offline" in proc.stderr and "unrecognized" in proc.stderr:
        pytest.skip("this systemd-analyze has no --offline (systemd < 250)")
    level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert level, proc.stdout[-500:] + proc.stderr
    assert proc.returncode == 0 and float(level.group(1)) <= 5.0, level.group(0)


@pytest.mark.process
def test_node_daemon_names_each_rank_after_its_own_job(tmp_path: Path) -> None:
    """The daemon's config (the example) has no run name: two ranks of two Slurm jobs on the
    node are labelled with their own job ids, not one static name."""
    import os
    import time
    import urllib.request

    marker = f"{os.getpid() % 1000:03d}"
    procs = []
    for job in ("4101", "4102"):
        out = open(tmp_path / f"job-{job}.out", "ab")  # noqa: SIM115 - held by the child
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "rankwatch.demo.trainer", "--format", "kv", "--step-time", "0.05",
                 "--rank", "0", "--world-size", "1", "--steps", f"100{marker}"],
                stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "SLURM_JOB_ID": job, "SLURM_PROCID": "0"},
            )
        )  # fmt: skip
        out.close()
    err = tmp_path / "agent.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANKWATCH_"))}
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(CONFIG_EXAMPLE),
         "--match", rf"rankwatch\.demo\.trainer .*--steps 100{marker}$", "--listen", "127.0.0.1:0",
         "--dumps-dir", str(tmp_path / "dumps"), "--set", f"alerts.spool_dir={tmp_path / 'spool'}",
         "--set", "gpu.enabled=false"],
        stdout=subprocess.DEVNULL, stderr=err.open("w"), env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        runs: set[str] = set()
        port = None
        while time.monotonic() < deadline:
            assert agent.poll() is None, err.read_text()
            if port is None:
                m = re.search(r"serving metrics and API on [^\s]+:(\d+)", err.read_text())
                port = m and int(m.group(1))
            else:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
                runs = set(re.findall(r'^rankwatch_step\{[^}]*run="([^"]+)"', text, re.M))
                if {"4101", "4102"} <= runs:
                    break
            time.sleep(0.2)
        assert runs == {"4101", "4102"}, (runs, err.read_text()[-2000:])
    finally:
        for p in (*procs, agent):
            p.kill()
            p.wait(10)
