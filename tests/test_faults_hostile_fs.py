"""A hostile filesystem under the real CLI (issue 26, "Tests"): a FUSE mount that never answers
as the dumps folder, and a memory cgroup the agent shares with its job while the run folder
holds links to /dev/zero and another user's 2 GiB sparse spool.

Both need root and a kernel facility (FUSE, the v1 memory controller); where the mount or the
cgroup is refused they skip with the reason conftest allows.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import free_port, wait_for
from faultlib import webhook

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root (a FUSE mount, a memory cgroup)")


def _env() -> dict[str, str]:
    agent = str(Path(__file__).resolve().parents[1] / "agent")
    drop = ("RANK", "SLURM_PROCID", "LOCAL_RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return dict(env, PYTHONPATH=agent, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")


def _get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _findings(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _stop_bound() -> float:
    unit = Path(__file__).resolve().parents[1] / "systemd" / "rankwatch.service"
    line = next(x for x in unit.read_text().splitlines() if x.startswith("TimeoutStopSec="))
    return float(line.split("=", 1)[1].rstrip("s"))


def _stop(p: subprocess.Popen[bytes], grace: float = 60.0) -> float:
    """SIGTERM, then how long the exit took (SIGKILL past ``grace``, which fails the caller)."""
    if p.poll() is not None:
        return 0.0
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return float("inf")
    return time.monotonic() - t0


# The FUSE "server": mounts with the /dev/fuse descriptor and then holds it, reading nothing and
# answering nothing (not even INIT), so every call under the mount waits. Exiting would close the
# descriptor and abort the connection (ENOTCONN), which is a different fault: it stays until killed.
_HUNG_FUSE = r"""
import ctypes, os, signal, sys
target = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/dev/fuse", os.O_RDWR)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
if libc.mount(b"rwhang", target.encode(), b"fuse.rwhang", 0, opts) != 0:
    print("mount-failed", ctypes.get_errno(), flush=True)
    sys.exit(3)
print("mounted", flush=True)
while True:
    signal.pause()
"""


@contextlib.contextmanager
def _hung_mount(where: Path) -> Iterator[Path]:
    """``where`` as a FUSE mount that never answers; unmounted lazily and its server killed after."""
    if not Path("/dev/fuse").exists():
        pytest.skip("no /dev/fuse (CAP_SYS_ADMIN and the fuse module are needed to mount)")
    where.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-c", _HUNG_FUSE, str(where)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        assert server.stdout is not None
        first = server.stdout.readline().decode().split()
        if first[:1] != ["mounted"]:
            server.wait(10)
            code = int(first[1]) if len(first) > 1 else 0
            pytest.skip(f"mounting FUSE was refused ({errno.errorcode.get(code, code)}): needs CAP_SYS_ADMIN")
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True, timeout=30)
        server.kill()  # closes /dev/fuse: whatever still waited on the mount gets ENOTCONN
        server.wait(10)


_STALLER = r"""
import os, sys, time
go = sys.argv[1]
for i in range(1, 13):
    print(f"step={i} loss={2.0 - i * 0.01:.3f}", flush=True)
    time.sleep(0.1)
deadline = time.monotonic() + 180
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(0)
"""


@pytest.mark.tool
@needs_root
@pytest.mark.timeout(240)
def test_a_dumps_folder_on_a_fuse_mount_that_never_answers_keeps_the_loop_the_alert_and_the_exit() -> None:
    """The run folder, its ``.ranks``, the board and the spool all on a mount that hangs every
    call: the loop keeps turning (/healthz answers), the stall finding says the dumps folder did
    not answer (not "no watched process"), the alert goes out once, SIGTERM ends the agent."""
    base = Path(tempfile.mkdtemp(prefix="rw-hungfs-"))
    try:
        with _hung_mount(base / "mnt") as mnt, webhook() as (url, posted):
            out = base / "out"
            out.mkdir()
            child = out / "child.py"
            child.write_text(_STALLER)
            port = free_port()
            cfg = out / "rw.yaml"
            cfg.write_text(
                "run: {name: hung, rank: 0}\nlogs: {format: kv, poll_interval: 50ms}\n"
                "detectors: {warmup_steps: 5}\nstall: {startup_grace: 20s, floor: 1s, factor: 2}\n"
                f"dumps: {{dir: {mnt / 'dumps'}, on_stall: true}}\n"
                f"runner: {{log_dir: {out / 'logs'}, term_grace: 3s}}\n"
                f'server: {{listen: "127.0.0.1:{port}"}}\ngpu: {{enabled: false}}\n'
                "alerts: {startup_quiet: 0s, group_wait: 0s, "
                f"spool_dir: {mnt / 'spool'}, webhook: {{urls: ['{url}']}}}}\n"
            )
            found = out / "findings.jsonl"
            go = out / "go"
            err = out / "agent.err"
            cmd = [
                sys.executable, "-m", "rankwatch", "-v", "run", "--config", str(cfg),
                "--findings-jsonl", str(found), "--", sys.executable, str(child), str(go),
            ]  # fmt: skip
            with open(err, "wb") as e_fh:
                agent = subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=e_fh, stdin=subprocess.DEVNULL, env=_env(), cwd=out
                )
            took = float("inf")
            try:

                def healthy() -> bool:
                    assert agent.poll() is None, err.read_text(errors="replace")
                    with contextlib.suppress(OSError):
                        return _get(f"http://127.0.0.1:{port}/healthz", 2.0) == (200, "ok\n")
                    return False

                assert wait_for(healthy, 60, "the agent serves /healthz")

                def stall() -> list[dict[str, Any]]:
                    healthy_now = healthy()  # the loop answers all along the wait
                    assert healthy_now, "/healthz stopped answering while the mount hung"
                    return [f for f in _findings(found) if f["kind"] == "stall" and not f.get("resolved")]

                stalls = wait_for(stall, 120, "the stall finding", interval=0.2)
                text = " ".join(str(f.get("message", "")) for f in stalls)
                assert "no watched process" not in text, text
                assert "did not answer" in text, text
                assert wait_for(lambda: [b for b in posted if '"stall"' in b], 60, "the stall alert")
                assert _get(f"http://127.0.0.1:{port}/healthz", 2.0) == (200, "ok\n")
                took = _stop(agent)
            finally:
                if agent.poll() is None:
                    _stop(agent)
            logs = err.read_text(errors="replace")
            stall_alerts = [b for b in posted if '"stall"' in b and '"firing"' in b]
            assert len(stall_alerts) == 1, (posted, logs)
            print(f"\nstall alerts {len(stall_alerts)}, SIGTERM to exit {took:.1f}s")
            # The bound is the unit's TimeoutStopSec: past it systemd SIGKILLs the agent.
            assert took < _stop_bound(), f"SIGTERM took {took:.1f}s\n{logs}"
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------ a memory cgroup shared with the job
CG_LIMIT = 300 * 1024 * 1024
OTHER_UID = 65534  # nobody: another user of the node

_CRASHER = r"""
import os, sys, time
go = sys.argv[1]
for i in range(1, 6):
    print(f"step={i} loss=2.0", flush=True)
deadline = time.monotonic() + 120
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.02)
print("Traceback (most recent call last):", flush=True)
print('  File "train.py", line 3, in <module>', flush=True)
print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
sys.exit(7)
"""


@contextlib.contextmanager
def _v1_memory_cgroup(limit: int) -> Iterator[Path]:
    """A new v1 memory cgroup under this process's own, limited to ``limit`` bytes."""
    own = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, rel = line.split(":", 2)
        if "memory" in ctrls.split(","):
            own = Path("/sys/fs/cgroup/memory") / rel.lstrip("/")
    if own is None or not (own / "cgroup.procs").exists():
        pytest.skip("needs root: no v1 memory cgroup controller to make a cgroup under")
    cg = own / f"rankwatch-shared-{os.getpid()}"
    try:
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(limit))
    except OSError as e:
        pytest.skip(f"needs root: cannot make a memory cgroup under {own}: {e}")
    try:
        yield cg
    finally:
        for pid in (cg / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (own / "cgroup.procs").write_text(pid)
        with contextlib.suppress(OSError):
            wait_for(lambda: not (cg / "cgroup.procs").read_text().split(), 10)
            cg.rmdir()


def _oom_kills(cg: Path) -> int:
    for line in (cg / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


@pytest.mark.tool
@needs_root
@pytest.mark.timeout(180)
def test_in_a_memory_cgroup_shared_with_the_job_dev_zero_records_and_a_huge_spool_kill_nobody() -> None:
    """The agent and its job in one 300 MiB cgroup; the run folder holds ``failed-*.json`` links to
    /dev/zero and another user planted a 2 GiB sparse spool. The job crashes: its exit status is
    its own (no OOM kill of it or of the agent) and the crash alert goes out."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("needs root and setpriv(1)")
    base = Path(tempfile.mkdtemp(prefix="rw-memcg-"))
    os.chmod(base, 0o755)
    try:
        with _v1_memory_cgroup(CG_LIMIT) as cg, webhook() as (url, posted):
            dumps, spool, out = base / "dumps", base / "spool", base / "out"
            for d in (dumps, spool, out):
                d.mkdir()
            os.chmod(spool, 0o1777)  # /tmp: another user may make files in it
            ranks = dumps / "mem" / ".ranks"
            ranks.mkdir(parents=True)
            us = round((time.time() - 5) * 1e6)
            for r, f in ((1, "f"), (1, "c"), (0, "f")):
                (ranks / f"failed-r{r}-{us}-{f}.json").symlink_to("/dev/zero")
            (ranks / "failed-1.json").symlink_to("/dev/zero")
            huge = spool / "mem.rank-0.jsonl"
            as_other = [setpriv, f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups"]
            subprocess.run([*as_other, "truncate", "-s", "2G", str(huge)], check=True, timeout=30)
            assert huge.stat().st_uid == OTHER_UID and huge.stat().st_size == 2 << 30
            child = out / "child.py"
            child.write_text(_CRASHER)
            cfg = out / "rw.yaml"
            cfg.write_text(
                "run: {name: mem, rank: 0, world_size: 2}\nlogs: {format: kv, poll_interval: 50ms}\n"
                f"dumps: {{dir: {dumps}, on_stall: false}}\nserver: {{enabled: false}}\n"
                f"runner: {{log_dir: {out / 'logs'}}}\ngpu: {{enabled: false}}\n"
                "alerts: {startup_quiet: 0s, group_wait: 0s, "
                f"spool_dir: {spool}, webhook: {{urls: ['{url}']}}}}\n"
            )
            found, go, err = out / "findings.jsonl", out / "go", out / "agent.err"
            # The agent puts itself into the cgroup before it starts: its job inherits it.
            enter = f'echo $$ > {cg / "cgroup.procs"} && exec "$@"'
            cmd = [
                "sh", "-c", enter, "sh", sys.executable, "-m", "rankwatch", "-v", "run", "--config", str(cfg),
                "--findings-jsonl", str(found), "--", sys.executable, str(child), str(go),
            ]  # fmt: skip
            with open(err, "wb") as e_fh:
                agent = subprocess.Popen(
                    cmd, stdout=subprocess.DEVNULL, stderr=e_fh, stdin=subprocess.DEVNULL, env=_env(), cwd=out
                )
            try:
                assert wait_for(
                    lambda: len((cg / "cgroup.procs").read_text().split()) >= 2, 60, "job started"
                )
                assert str(agent.pid) in (cg / "cgroup.procs").read_text().split()
                go.touch()
                code = agent.wait(timeout=120)
            finally:
                go.touch()
                if agent.poll() is None:
                    _stop(agent)
            logs = err.read_text(errors="replace")
            peak = int((cg / "memory.max_usage_in_bytes").read_text())
            failcnt = int((cg / "memory.failcnt").read_text())
            kills = _oom_kills(cg)
            mib = 2**20
            print(
                f"\ncgroup peak {peak / mib:.1f} of {CG_LIMIT / mib:.0f} MiB, failcnt {failcnt}, oom {kills}"
            )
            assert code == 7, logs  # the job's own status: neither it nor the agent was killed
            assert kills == 0 and peak < CG_LIMIT, (peak, failcnt, kills)
            # The job's CUDA error and its crash are one failure: one alert, whichever kind leads it.
            failed = ("crash", "cuda_error")
            crash_alerts = [b for b in posted if '"firing"' in b and json.loads(b)["kind"] in failed]
            assert len(crash_alerts) == 1, (posted, logs)
            assert huge.stat().st_size == 2 << 30 and huge.stat().st_uid == OTHER_UID
    finally:
        shutil.rmtree(base, ignore_errors=True)
