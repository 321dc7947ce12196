"""The agent as a confused deputy: files the job can swap must never make it read what the
job could not (issue 16, items 1 and 2).

The attacks run against the real CLI: a node agent that is not root but holds
``CAP_DAC_READ_SEARCH`` (as the systemd unit) follows a log whose owner swaps it for a
symlink to a root-only file; symlinks, a FIFO and a device planted in a shared dumps
folder are asked for over ``/api/dumps``. Nothing of the targets may reach a finding, the
API, the status page, the log or the console. Below them: the ``safeio`` rules one by one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import agent_token
from rankwatch import safeio
from rankwatch.dumps.capture import DumpResult
from rankwatch.dumps.store import DumpStore
from rankwatch.sources.follower import LogFollower

ROOT = os.geteuid() == 0
AGENT_UID = 1  # daemon: the agent's own user, neither root nor the job's
JOB_UID = 65534  # nobody: the job's user
SECRET = "RW-SECRET-7f3a9c"
# What a swapped-in target would be quoted as: a traceback is the cause of a crash finding.
SECRET_TEXT = (
    "Traceback (most recent call last):\n"
    '  File "/root/deploy.py", line 3, in <module>\n'
    f"RuntimeError: CUDA error: an illegal memory access was encountered {SECRET}\n"
    f"SLACK_BOT_TOKEN=xoxb-{SECRET}\n"
)
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (files owned by another user)")


# --------------------------------------------------------------------------- helpers
_TOKEN_DIR: dict[str, Path] = {}  # "agent": set (monkeypatched) by a test whose agent is another user


def _token() -> str:
    if "agent" in _TOKEN_DIR:  # read as root: the file is the agent user's, 0600
        return (_TOKEN_DIR["agent"] / "token").read_text().strip()
    return agent_token()


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET with the token the agent made in this test's runtime folder (none on /metrics)."""
    private = not url.split("/", 3)[-1].startswith(("metrics", "healthz", "readyz"))
    headers = {"Authorization": f"Bearer {_token()}"} if private else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _wait(pred, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def _url(err: Path) -> str | None:
    """The agent's listen address from its log (it binds a free loopback port)."""
    text = err.read_text(errors="replace") if err.exists() else ""
    for line in text.splitlines():
        if "serving metrics and API on " in line:
            return "http://" + line.rsplit("serving metrics and API on ", 1)[1].strip()
    return None


def _env() -> dict[str, str]:
    agent = str(Path(__file__).resolve().parents[1] / "agent")
    return dict(os.environ, PYTHONPATH=agent, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder other users can reach (pytest's tmp_path is 0700 root's)."""
    base = Path(tempfile.mkdtemp(prefix="rw-secfiles-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _secret_file(path: Path) -> Path:
    path.write_text(SECRET_TEXT)
    os.chmod(path, 0o600)  # owned by whoever runs the test: root where it matters
    return path


def _setpriv(uid: int, gid: int, *, caps: bool) -> list[str] | None:
    tool = shutil.which("setpriv")
    if not ROOT or tool is None:
        return None
    cmd = [tool, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    if caps:
        cmd += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return cmd


# ---------------------------------------------------------- (a) the swapped log, real CLI
_JOB = """
import os, sys, time
job, secret = sys.argv[1], sys.argv[2]
log = os.path.join(job, "rank-0.log")
with open(log, "a") as fh:
    for i in range(1, 6):
        fh.write(f"step={i} loss={2.0 / i:.3f}\\n")
def wait(name):
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(job, name)) and time.monotonic() < deadline:
        time.sleep(0.02)
wait("go")
link = os.path.join(job, ".swap")
os.symlink(secret, link)
os.rename(link, log)  # "rotation": the log is now a symlink to a root-only file
wait("exit")
sys.exit(1)
"""


@pytest.mark.tool
@needs_root
def test_log_swapped_for_a_symlink_to_a_root_only_file_is_never_read(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = _secret_file(shared / "root-only.txt")
    assert os.stat(secret).st_uid == 0 and stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    job = shared / "job"
    job.mkdir(mode=0o755)
    os.chown(job, JOB_UID, JOB_UID)
    out = shared / "out"
    out.mkdir(mode=0o755)
    script = shared / "job.py"
    script.write_text(_JOB)
    os.chmod(script, 0o644)
    marker = f"secfiles-{os.getpid()}"
    cfg = shared / "rw.yaml"
    cfg.write_text(
        "run: {name: sec, rank: 0}\nlogs: {poll_interval: 100ms, format: kv}\n"
        f"process: {{sample_interval: 200ms}}\ndumps: {{dir: {out / 'dumps'}, on_stall: false}}\n"
        "server: {listen: '127.0.0.1:0'}\n"
    )
    os.chmod(cfg, 0o644)

    as_job = _setpriv(JOB_UID, JOB_UID, caps=False)
    as_agent = _setpriv(AGENT_UID, AGENT_UID, caps=True)
    if as_job is None or as_agent is None:
        pytest.skip("needs root and setpriv(1) to act as the job's and the agent's users")
    probe = subprocess.run([*as_agent, "cat", str(secret)], capture_output=True, timeout=30)
    if probe.returncode == 0:
        os.chown(out, AGENT_UID, AGENT_UID)
        assert SECRET in probe.stdout.decode()  # the agent really could read it: the attack is real
    else:  # no ambient capabilities here: the agent runs as root, the owner check still holds
        as_agent = []
    found = out / "findings.jsonl"
    err, console = out / "agent.err", out / "agent.out"
    # the agent's own runtime folder, where it keeps the token it makes (its user's, 0700)
    runtime = out / "xdg"
    runtime.mkdir(mode=0o700)
    if as_agent:
        os.chown(runtime, AGENT_UID, AGENT_UID)
    monkeypatch.setitem(_TOKEN_DIR, "agent", runtime / "rankwatch")
    job_proc = subprocess.Popen(
        [*as_job, sys.executable, str(script), str(job), str(secret), marker], env=_env(), cwd=shared
    )
    watch = ["watch", "--config", str(cfg), "--match", marker, "--log", str(job / "rank-0.log")]
    with open(err, "wb") as e_fh, open(console, "wb") as o_fh:
        agent = subprocess.Popen(
            [*as_agent, sys.executable, "-m", "rankwatch", "-v", *watch, "--findings-jsonl", str(found)],
            stdout=o_fh,
            stderr=e_fh,
            env=dict(_env(), XDG_RUNTIME_DIR=str(runtime)),
            cwd=out,
        )
    pages: dict[str, str] = {}
    try:
        assert _wait(lambda: _url(err) is not None), err.read_text()
        url = _url(err)
        assert url is not None

        def lines() -> float:
            text = _get(url + "/metrics")[1]
            return sum(
                float(x.rsplit(" ", 1)[1])
                for x in text.splitlines()
                if x.startswith("rankwatch_log_lines_total{")
            )

        assert _wait(lambda: lines() >= 5), err.read_text()
        (job / "go").touch()
        # The new code refuses (and counts) the swap; the old one silently read the target.
        _wait(lambda: (_metric(_get(url + "/metrics")[1], "rankwatch_log_open_refused_total") or 0) >= 1, 10)
        (job / "exit").touch()
        assert job_proc.wait(timeout=60) == 1

        def exited() -> bool:
            if not found.exists():
                return False
            return any(
                json.loads(x)["kind"] in ("crash", "process_exit") for x in found.read_text().splitlines()
            )

        assert _wait(exited, 60), err.read_text()
        for path in ("/api/findings", "/api/status", "/", "/metrics"):
            status, body = _get(url + path)
            assert status == 200, (path, status)
            pages[path] = body
        metrics = pages["/metrics"]
    finally:
        for p in (job_proc, agent):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(timeout=30)
        for p in (job_proc, agent):
            if p.poll() is None:
                p.kill()
                p.wait()
    logs = err.read_text(errors="replace")
    everything = {
        "findings jsonl": found.read_text(errors="replace"),
        "agent log": logs,
        "console": console.read_text(errors="replace"),
        **pages,
    }
    for where, text in everything.items():
        assert SECRET not in text, f"the root-only file leaked into the {where}"
    # The refusal is said once, names the path and why, and is counted once.
    refusals = [x for x in logs.splitlines() if "refusing to open" in x]
    assert len(refusals) == 1, logs
    assert str(job / "rank-0.log") in refusals[0] and "symlink" in refusals[0]
    assert _metric(metrics, "rankwatch_log_open_refused_total") == 1
    promtool = shutil.which("promtool")
    if promtool is not None:  # the new counter, with its sample, is a clean exposition
        checked = subprocess.run([promtool, "check", "metrics"], input=metrics.encode(), capture_output=True)
        assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr
    # The agent kept watching: it saw the exit after the refusal.
    kinds = [json.loads(x)["kind"] for x in everything["findings jsonl"].splitlines()]
    assert "crash" in kinds or "process_exit" in kinds


# ------------------------------------------------------ (b) the shared dumps folder, real CLI
def _result() -> DumpResult:
    frames = [{"name": "wait", "filename": "/workspace/train.py", "line": 3}]
    return DumpResult(
        pid=4242,
        ok=True,
        threads=[{"thread_name": "MainThread", "pid": 4242, "active": True, "frames": frames}],
        text="Process 4242: python train.py\n",
        error=None,
        duration_s=0.1,
        command=["py-spy", "dump", "--pid", "4242", "--json"],
        captured_at=datetime(2026, 11, 22, 10, 15, tzinfo=timezone.utc),
    )


def _plant(dumps: Path, outside: Path, secret: Path) -> dict[str, str]:
    """A real incident with rank 0, and every trap a writer of the shared folder can set."""
    store = DumpStore(dumps)
    store.write_rank("r", "20261122T101500Z_stall", 0, _result(), {})
    inc = dumps / "r" / "20261122T101500Z_stall"
    (inc / "rank-1.json").symlink_to(secret)
    (inc / "rank-1.txt").symlink_to(secret)
    os.mkfifo(inc / "rank-2.json")
    os.mkfifo(inc / "rank-2.txt")
    (inc / "rank-3.txt").write_text("real text of rank 3\n")  # no JSON: served from the text
    (inc / "rank-4.txt").symlink_to(secret)
    (inc / "rank-4.json").write_text('{"rank": 4, "ok": false}')
    if ROOT:
        os.mknod(inc / "rank-5.json", 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero
    (outside / "20261122T101600Z_stall").mkdir()
    (outside / "20261122T101600Z_stall" / "rank-0.json").write_text(json.dumps({"text": SECRET_TEXT}))
    (outside / "20261122T101600Z_stall" / "rank-0.txt").write_text(SECRET_TEXT)
    (dumps / "r" / "20261122T101600Z_stall").symlink_to(outside / "20261122T101600Z_stall")  # a folder
    (dumps / "elsewhere").symlink_to(outside)  # a whole run folder
    return {"20261122T101500Z_stall": "r", "20261122T101600Z_stall": "r"}


@pytest.mark.process
def test_symlinks_fifos_and_devices_in_the_dumps_folder_are_404_and_never_read(
    shared: Path, tmp_path: Path
) -> None:
    secret = _secret_file(shared / "shadow")
    outside = shared / "outside"
    outside.mkdir()
    dumps = tmp_path / "dumps"
    _plant(dumps, outside, secret)
    log = tmp_path / "rank-0.log"
    log.write_text("step=1 loss=2.0\n")
    cfg = tmp_path / "rw.yaml"
    cfg.write_text("run: {name: r, rank: 0}\nserver: {listen: '127.0.0.1:0'}\n")
    err = tmp_path / "agent.err"
    with open(err, "wb") as e_fh:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rankwatch",
                "-v",
                "watch",
                "--config",
                str(cfg),
                "--log",
                str(log),
                "--dumps-dir",
                str(dumps),
            ],
            stdout=subprocess.DEVNULL,
            stderr=e_fh,
            env=_env(),
            cwd=tmp_path,
        )
    try:
        assert _wait(lambda: _url(err) is not None), err.read_text()
        url = _url(err)
        assert url is not None
        status, body = _get(url + "/api/dumps/20261122T101500Z_stall/0")
        assert status == 200 and json.loads(body)["pid"] == 4242  # the real dump is served
        assert _get(url + "/api/dumps/20261122T101500Z_stall/3?format=text") == (200, "real text of rank 3\n")
        asks = [
            "/api/dumps/20261122T101500Z_stall/1",  # symlinks to the secret
            "/api/dumps/20261122T101500Z_stall/1?format=text",
            "/api/dumps/20261122T101500Z_stall/2",  # FIFOs: would block a reader forever
            "/api/dumps/20261122T101500Z_stall/2?format=text",
            "/api/dumps/20261122T101500Z_stall/4?format=text",  # a symlinked text beside a real JSON
            "/api/dumps/20261122T101500Z_stall/5",  # a character device
            "/api/dumps/20261122T101600Z_stall/0",  # a symlinked incident folder
            "/api/dumps/20261122T101600Z_stall/0?format=text",
        ]
        for ask in asks:
            started = time.monotonic()
            status, body = _get(url + ask, timeout=5)
            assert status == 404, (ask, status, body[:200])
            assert SECRET not in body and time.monotonic() - started < 5, ask
        status, listing = _get(url + "/api/dumps")
        assert status == 200 and SECRET not in listing
        incidents = {(i["run"], i["incident"]): i for i in json.loads(listing)["incidents"]}
        assert list(incidents) == [("r", "20261122T101500Z_stall")]  # neither symlinked folder
        assert incidents["r", "20261122T101500Z_stall"]["ranks"] == [0, 3, 4]
        status, page = _get(url + "/")
        assert status == 200 and SECRET not in page
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    assert SECRET not in err.read_text(errors="replace")

    # The same folder through the CLI: list, show and diff read nothing through a symlink.
    for args in (
        ["list"],
        ["show", "20261122T101500Z_stall"],
        ["show", "r/20261122T101500Z_stall", "--rank", "1"],
        ["show", "20261122T101600Z_stall"],
        ["diff", "20261122T101500Z_stall", "--json"],
        ["show", "--run", "elsewhere", "20261122T101600Z_stall"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "rankwatch", "dumps", *args, "--dir", str(dumps)],
            capture_output=True,
            text=True,
            timeout=60,
            env=_env(),
            cwd=tmp_path,
        )
        assert SECRET not in done.stdout + done.stderr, args
        assert "Traceback" not in done.stderr, (args, done.stderr)


# ------------------------------------------------------------------------ the follower
@pytest.mark.unit
def test_follower_refuses_a_symlink_swap_once_counts_it_and_reads_on_when_the_file_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = _secret_file(tmp_path / "secret")
    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "rank-0.log"
    path.write_text("step=1 loss=2.0\n")
    f = LogFollower(path)
    assert [x.text for x in f.read_available()] == ["step=1 loss=2.0"]
    path.unlink()
    path.symlink_to(secret)
    for _ in range(3):
        assert f.read_available() == []
    assert f.stats.refused_opens == 1
    warned = [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()]
    assert len(warned) == 1 and str(path) in warned[0] and "symlink" in warned[0]
    assert SECRET not in caplog.text
    path.unlink()
    path.write_text("step=2 loss=1.0\n")
    assert [x.text for x in f.read_available()] == ["step=2 loss=1.0"]
    f.close()


@pytest.mark.unit
@pytest.mark.timeout(20)
def test_follower_never_opens_a_fifo_swapped_in(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_text("a\n")
    f = LogFollower(path)
    assert [x.text for x in f.read_available()] == ["a"]
    path.unlink()
    os.mkfifo(path)  # no writer: a plain open would hang the agent's loop
    assert f.read_available() == []  # a blocking open hangs here and fails by the timeout
    assert f.stats.refused_opens == 1
    f.close()


@pytest.mark.unit
def test_follower_refuses_a_log_folder_swapped_for_a_symlink(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank-0.log").write_text("mine\n")
    f = LogFollower(logs / "rank-0.log")
    assert [x.text for x in f.read_available()] == ["mine"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "rank-0.log").write_text(SECRET_TEXT)
    logs.rename(tmp_path / "logs.old")
    logs.symlink_to(elsewhere)
    got = f.read_available()
    assert SECRET not in "".join(x.text for x in got)
    assert f.read_available() == [] and f.stats.refused_opens == 1
    f.close()


@pytest.mark.unit
def test_follower_follows_a_configured_symlinked_folder_and_a_link_beside_it_but_no_link_out(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "rank-0.log").write_text("x\n")
    (tmp_path / "alias").symlink_to(real)  # the operator's own symlink, there when configured
    f = LogFollower(tmp_path / "alias" / "rank-0.log")
    assert [x.text for x in f.read_available()] == ["x"]
    f.close()
    secret = _secret_file(tmp_path / "secret")
    for name, target in (("up.log", "../secret"), ("abs.log", str(secret)), ("sub.log", "sub/rank-0.log")):
        (real / name).symlink_to(target)
        g = LogFollower(real / name)
        assert g.read_available() == [] and g.stats.refused_opens == 1, name
        g.close()
    # latest.log -> rank-0.log (relative or absolute) is the same file, read as such ...
    (real / "abs-latest.log").symlink_to(real / "rank-0.log")
    h = LogFollower(real / "abs-latest.log")
    assert [x.text for x in h.read_available()] == ["x"]
    h.close()
    (real / "latest.log").symlink_to("rank-0.log")
    f = LogFollower(real / "latest.log")
    assert [x.text for x in f.read_available()] == ["x"]
    with open(real / "rank-0.log", "a") as fh:
        fh.write("y\n")
    assert [x.text for x in f.read_available()] == ["y"]
    assert f.read_available() == [] and f.stats.rotations == 0  # no rotation seen at every end
    # ... and pointing it at the next file is a rotation.
    (real / "rank-1.log").write_text("z\n")
    (real / ".next").symlink_to("rank-1.log")
    os.rename(real / ".next", real / "latest.log")
    assert [x.text for x in f.read_available()] == ["z"]
    assert f.stats.rotations == 1 and f.stats.refused_opens == 0
    f.close()


@pytest.mark.unit
@needs_root
def test_follower_refuses_another_owners_file_on_reopen(tmp_path: Path) -> None:
    """A hard link or a rename that brings in a root-owned file: same name, another owner."""
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o755)
    os.chown(logs, JOB_UID, JOB_UID)
    path = logs / "rank-0.log"
    path.write_text("step=1 loss=2.0\n")
    os.chown(path, JOB_UID, JOB_UID)
    f = LogFollower(path)
    assert [x.text for x in f.read_available()] == ["step=1 loss=2.0"]
    secret = _secret_file(tmp_path / "secret")
    path.unlink()
    os.link(secret, path)  # root may; the kernel stops the job itself only with protected_hardlinks
    assert f.read_available() == [] and f.stats.refused_opens == 1
    f.close()
    # A follower made after the swap: the folder is the job user's, so only their files count.
    g = LogFollower(path)
    assert g.read_available() == [] and g.stats.refused_opens == 1
    g.close()


@pytest.mark.unit
def test_restarted_watchers_history_is_read_through_the_checked_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_text("one\ntwo\n")
    f = LogFollower(path, from_end=True)
    secret = _secret_file(tmp_path / "secret")
    path.unlink()
    path.symlink_to(secret)
    assert f.read_back(0, f.position) == b"one\ntwo\n"
    f.close()


# ---------------------------------------------------------------------------- safeio
@pytest.mark.unit
def test_open_file_beneath_reads_a_regular_file_and_refuses_every_trap(tmp_path: Path) -> None:
    secret = _secret_file(tmp_path / "secret")
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.txt").write_text("fine")
    (root / "sub" / "link.txt").symlink_to(secret)
    (root / "dirlink").symlink_to(tmp_path)
    os.mkfifo(root / "sub" / "fifo")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert safeio.read_beneath(fd, ["sub", "ok.txt"]) == b"fine"
        assert safeio.read_beneath(root, ["sub", "ok.txt"], limit=2) == b"fi"
        cases = {
            ("sub", "link.txt"): "is a symlink",
            ("dirlink", "secret"): "is a symlink, not a directory",
            ("sub", "fifo"): "is a FIFO",
            ("sub",): "is a directory",
            ("..", "secret"): "not a plain name",
            ("sub", "..", "..", "secret"): "not a plain name",
            ("sub/ok.txt",): "not a plain name",
        }
        for parts, why in cases.items():
            with pytest.raises(safeio.Refused, match=why) as caught:
                safeio.read_beneath(fd, parts)
            assert isinstance(caught.value, OSError) and SECRET not in str(caught.value)
        with pytest.raises(FileNotFoundError):
            safeio.read_beneath(fd, ["sub", "missing"])
        with pytest.raises(safeio.Refused, match="owned by uid"):
            safeio.open_file_beneath(fd, ["sub", "ok.txt"], owners=[os.geteuid() + 1])
    finally:
        os.close(fd)


@pytest.mark.unit
@pytest.mark.timeout(20)
def test_open_file_beneath_catches_a_swap_between_its_lstat_and_its_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "f").write_text("fine")
    real_stat = os.stat

    def swapping_stat(*args: object, **kwargs: object) -> os.stat_result:
        st = real_stat(*args, **kwargs)  # type: ignore[arg-type]
        if args and args[0] == "f":  # the job replaces the file right after the check
            os.unlink(tmp_path / "f")
            os.mkfifo(tmp_path / "f")
        return st

    monkeypatch.setattr(os, "stat", swapping_stat)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(safeio.Refused, match="replaced while being opened"):
            safeio.open_file_beneath(fd, ["f"])  # O_NONBLOCK: a FIFO would hang it (test timeout)
    finally:
        os.close(fd)


@pytest.mark.unit
@needs_root
def test_a_device_is_never_opened(tmp_path: Path) -> None:
    os.mknod(tmp_path / "dev", 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    with pytest.raises(safeio.Refused, match="character device"):
        safeio.read_beneath(tmp_path, ["dev"])


@pytest.mark.unit
def test_open_dir_refuses_a_component_swapped_for_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    resolved, owners = safeio.resolve_dir(tmp_path / "a" / "b")
    assert resolved == os.path.realpath(tmp_path / "a" / "b") and not owners
    os.close(safeio.open_dir(resolved))
    (tmp_path / "a").rename(tmp_path / "a.old")
    (tmp_path / "a").symlink_to(tmp_path / "a.old")
    with pytest.raises(safeio.Refused, match="symlink"):
        safeio.open_dir(resolved)
    with pytest.raises(OSError) as missing:
        safeio.open_dir(tmp_path / "nope" / "b")
    assert missing.value.errno == errno.ENOENT


@pytest.mark.unit
def test_resolve_dir_keeps_missing_parts_and_resolves_relative_links(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    resolved, _ = safeio.resolve_dir(tmp_path / "link" / "later" / "deeper")
    assert resolved == os.path.join(os.path.realpath(tmp_path), "real", "later", "deeper")


@pytest.mark.unit
@needs_root
def test_resolve_dir_names_the_owner_of_a_users_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    os.lchown(link, JOB_UID, JOB_UID)
    assert safeio.resolve_dir(link) == (os.path.realpath(tmp_path / "real"), frozenset({JOB_UID}))
    # A log read through that user's symlink must be theirs, even at the first open.
    (tmp_path / "real" / "rank-0.log").write_text(SECRET_TEXT)
    f = LogFollower(link / "rank-0.log")
    assert f.read_available() == [] and f.stats.refused_opens == 1
    f.close()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("run-7.log", "run-7.log"),
        ("/logs/run-7.log", "run-7.log"),
        ("/logs/sub/run-7.log", None),
        ("/other/run-7.log", None),
        ("../logs/run-7.log", None),
        ("./run-7.log", None),
        ("..", None),
        ("", None),
    ],
)
def test_sibling_names_only_a_file_of_the_same_folder(target: str, expected: str | None) -> None:
    assert safeio.sibling(target, "/logs") == expected
