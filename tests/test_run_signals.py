"""The user's stop signals under ``rankwatch run``, on real processes (no torch: a
``multiprocessing`` launcher that joins its workers is the shape of ``torch.multiprocessing.spawn``,
whose ranks tests/test_spawn_job.py runs for real).

The command runs in a session of its own, out of the terminal's reach, so the agent delivers a
terminal's signals (SIGINT, SIGQUIT, SIGHUP) to its whole process group, as the terminal would
have; whatever still runs ``runner.term_grace`` after the first stop is SIGKILLed with its group,
also when the launcher never exits (it waits in ``join`` for workers that ignore the signal). The
exit finding names the signal that really ended the command, and the KeyboardInterrupt the
user's own Ctrl-C raised is no finding.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import wait_for
from faultlib import stop_processes

pytestmark = pytest.mark.process

# A launcher as torch.multiprocessing.spawn is one: ``nprocs`` non-daemonic workers started with
# the spawn method, then join (and Python's exit joins them again). ``ignore``: every process
# ignores SIGINT (a handler that does not stop, a C call that never returns).
LAUNCHER = r"""
import multiprocessing as mp, os, signal, sys, time

def work(ignore):
    if ignore:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdout.write(f"worker pid {os.getpid()}\n")
    sys.stdout.flush()
    while True:
        time.sleep(1)

if __name__ == "__main__":
    ignore = sys.argv[1] == "ignore"
    if ignore:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in range(1, 6):
        print(f"step={s} loss={2 + 1 / s:.3f} lr=1e-4", flush=True)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=work, args=(ignore,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
"""
# A script that catches Ctrl-C, says so with the traceback, and takes its time to clean up (a
# checkpoint saved on the way out) before it exits.
CLEANUP = r"""
import os, sys, time, traceback
for s in range(1, 6):
    print(f"step={s} loss={2 + 1 / s:.3f} lr=1e-4", flush=True)
print(f"worker pid {os.getpid()}", flush=True)
try:
    time.sleep(600)
except KeyboardInterrupt:
    traceback.print_exc()
    sys.stdout.flush(); sys.stderr.flush()
    time.sleep(float(sys.argv[1]))
    sys.exit(130)
"""


def _start(tmp: Path, script: str, *args: str, term_grace: str) -> tuple[subprocess.Popen[str], str]:
    cfg = tmp / "rw.yaml"
    cfg.write_text(
        f"run: {{name: sig-{uuid.uuid4().hex[:8]}}}\n"
        "stall: {enabled: false}\n"
        "process: {sample_interval: 100ms}\n"
        f"dumps: {{dir: {tmp / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp / 'logs'}, term_grace: {term_grace}, echo: false}}\n"
        "server: {enabled: false}\ngpu: {enabled: false}\n"
        f"alerts: {{spool_dir: {tmp / 'spool'}}}\n"
    )
    (tmp / "job.py").write_text(script)
    tag = uuid.uuid4().hex
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "WORLD_SIZE")
    }
    env["RW_TEST_TAG"] = tag
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg), "--findings-jsonl",
           str(tmp / "f.jsonl"), "--", sys.executable, "-u", str(tmp / "job.py"), *args]  # fmt: skip
    # SIGINT at its default in the agent's children whatever this test runner ignores: the agent
    # installs its own handler, and a shell's Ctrl-C reaches a foreground job that way.
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return p, tag


def _job(tag: str, agent: int) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if (
                p.pid != agent
                and p.environ().get("RW_TEST_TAG") == tag
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _workers(tmp: Path, n: int) -> list[int]:
    def found() -> list[int]:
        text = "".join(p.read_text(errors="replace") for p in (tmp / "logs").glob("*.log"))
        pids = [int(line.split()[-1]) for line in text.splitlines() if line.startswith("worker pid ")]
        return pids if len(pids) >= n else []

    return wait_for(found, 60, "the job's workers", 0.1)


def _findings(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "f.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _ended(p: subprocess.Popen[str], tag: str, within: float) -> tuple[int, float]:
    """The agent's exit status, and how long after the signal every process of the job was gone."""
    t0 = time.monotonic()
    wait_for(lambda: not _job(tag, p.pid), within, "every process of the job to end", 0.05)
    took = time.monotonic() - t0
    return p.wait(timeout=30), took


def _cleanup(p: subprocess.Popen[str], tag: str) -> None:
    stop_processes([p])
    for pid in _job(tag, p.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_ctrl_c_reaches_every_process_of_the_command_as_in_a_terminal(tmp_path: Path) -> None:
    """The launcher's workers get the SIGINT too, so the launcher's join returns and the job
    ends on the user's Ctrl-C itself (status 130), well before term_grace; its KeyboardInterrupt
    tracebacks (launcher and workers) are the user's stop, not findings."""
    p, tag = _start(tmp_path, LAUNCHER, "default", term_grace="30s")
    try:
        _workers(tmp_path, 2)
        p.send_signal(signal.SIGINT)
        rc, took = _ended(p, tag, 30)
    finally:
        _cleanup(p, tag)
    found = _findings(tmp_path)
    assert rc == 130, (rc, took, found, p.stderr.read() if p.stderr else "")
    assert not [f for f in found if f["kind"] in ("traceback", "crash")], found
    (done,) = [f for f in found if f["kind"] == "process_exit"]
    assert done["message"] == "process stopped on the SIGINT we forwarded (signal 2)", done


def test_a_launcher_that_never_exits_is_ended_term_grace_after_ctrl_c(tmp_path: Path) -> None:
    """Every process ignores SIGINT and the launcher waits in join for ever: term_grace after the
    user's Ctrl-C the whole process group is SIGKILLed, and the exit finding says so."""
    p, tag = _start(tmp_path, LAUNCHER, "ignore", term_grace="2s")
    try:
        _workers(tmp_path, 2)
        p.send_signal(signal.SIGINT)
        rc, took = _ended(p, tag, 2 + 15)
    finally:
        _cleanup(p, tag)
    found = _findings(tmp_path)
    err = p.stderr.read() if p.stderr else ""
    assert rc == 137 and took >= 1.5, (rc, took, found, err)
    assert "child did not exit 2s after SIGINT: sending SIGKILL to its process group" in err, err
    (done,) = [f for f in found if f["kind"] == "process_exit"]
    assert done["message"] == (
        "process stopped on the SIGKILL we sent 2s (runner.term_grace) after forwarding SIGINT (signal 9)"
    ), done


def test_the_exit_finding_names_the_signal_that_ended_the_command(tmp_path: Path) -> None:
    """SIGINT, which the command ignores, then SIGTERM, which kills it: it was the SIGTERM."""
    p, tag = _start(tmp_path, LAUNCHER, "ignore", term_grace="30s")
    try:
        _workers(tmp_path, 2)
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the two signals arrive apart, as a user sends them
        p.send_signal(signal.SIGTERM)
        rc, _ = _ended(p, tag, 30)
    finally:
        _cleanup(p, tag)
    found = _findings(tmp_path)
    assert rc == 143, (rc, found)
    (done,) = [f for f in found if f["kind"] == "process_exit"]
    assert done["message"] == "process stopped on the SIGTERM we forwarded (signal 15)", done


def test_the_keyboardinterrupt_of_the_users_own_ctrl_c_is_no_finding(tmp_path: Path) -> None:
    """The script prints the KeyboardInterrupt traceback and cleans up for longer than a live
    process's traceback is held (15 s) before it exits: still the user's stop, no warning."""
    p, tag = _start(tmp_path, CLEANUP, "17", term_grace="30s")
    try:
        _workers(tmp_path, 1)
        p.send_signal(signal.SIGINT)
        rc, took = _ended(p, tag, 30)
    finally:
        _cleanup(p, tag)
    found = _findings(tmp_path)
    assert rc == 130 and took >= 15, (rc, took, found)
    assert not [f for f in found if f["kind"] in ("traceback", "crash")], found
    (done,) = [f for f in found if f["kind"] == "process_exit"]
    assert done["message"] == "process stopped on the SIGINT we forwarded (exit code 130)", done
