"""Launch form x failure, on real PyTorch (CPU, gloo): the cheapest real workload that shows
each cell (tests/workloads/ddp_train.py, two ranks, tens of steps). Each cell runs the job to
its end and asserts the findings (kind, rank, step), the alerts the webhook received (title,
suspect, first failure, one per problem), the agent's exit status, and that nothing of the job
is left running.

Forms built here: ``run -- torchrun`` plain (no ``--tee``: the combined log is read), and
with ``--max-restarts``. Failures: NaN at a known step, a raise that torchrun restarts,
healthy completion, a rank that leaves early with exit 0.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = [
    pytest.mark.tool,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="PyTorch not installed (CI installs torch==2.13.0)"
    ),
]

WORKLOAD = Path(__file__).parent / "workloads" / "ddp_train.py"
RUN_S = 240.0  # two ranks import torch on two busy cores, then tens of 50 ms steps


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cell:
    tmp: Path
    rc: int
    findings: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    log: str
    tag: str
    out: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.findings if f["kind"] == kind and not f.get("resolved")]

    def alerts_of(self, kind: str) -> list[dict[str, Any]]:
        return [a for a in self.alerts if a["kind"] == kind and a["status"] == "firing"]


def _receiver() -> tuple[ThreadingHTTPServer, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, got


def _job_processes(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("RW_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def run_cell(tmp: Path, launcher: list[str], env: dict[str, str], *, world: int = 2) -> Cell:
    """``rankwatch run -- <launcher> ddp_train.py`` to its end; the webhook's alerts and the
    JSONL findings, once the agent has exited (its alerts flushed on the way out)."""
    srv, got = _receiver()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    tag = uuid.uuid4().hex
    cfg = tmp / "rw.yaml"
    cfg.write_text(
        f"run: {{name: cell-{tag[:8]}}}\n"
        "stall: {startup_grace: 120s, floor: 4s, factor: 10}\n"
        "process: {sample_interval: 250ms}\n"
        f"dumps: {{dir: {tmp / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp / 'logs'}, term_grace: 3s, echo: false}}\n"
        "server: {enabled: false}\ngpu: {enabled: false}\n"
        f"alerts: {{startup_quiet: 0s, group_wait: 1s, spool_dir: {tmp / 'spool'}, board_dir: '',"
        f" webhook: {{urls: ['{url}']}}}}\n"
    )
    full_env = dict(os.environ, OMP_NUM_THREADS="1", RW_TEST_TAG=tag, STEP_S="0.05", **env)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
        full_env.pop(var, None)
    cmd = [sys.executable, "-m", "rankwatch", "run", "--config", str(cfg)]
    cmd += ["--findings-jsonl", str(tmp / "f.jsonl"), "--", *launcher, str(WORKLOAD)]
    try:
        done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=RUN_S)
    finally:
        srv.shutdown()
        # A killed rank's DataLoader worker notices its parent is gone within PyTorch's
        # MP_STATUS_CHECK_INTERVAL (5 s, torch/utils/data/_utils/__init__.py) and exits on its own.
        deadline = time.monotonic() + 10.0
        while (left := _job_processes(tag)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in left:
            p.kill()
    path = tmp / "f.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    logs = sorted((tmp / "logs").glob("*.log"))
    text = "".join(p.read_text(errors="replace") for p in logs)
    cell = Cell(tmp, done.returncode, rows, list(got), text, tag, done.stdout + done.stderr)
    assert not left, f"left running: {[p.pid for p in left]}"
    return cell


def torchrun(world: int = 2, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master-port",
            str(_free_port()), "--nproc-per-node", str(world), *extra]  # fmt: skip


def _debug(c: Cell) -> str:
    rows = [(f["kind"], f["rank"], f["step"], f["message"][:160]) for f in c.findings]
    return f"rc={c.rc}\nfindings={rows}\nalerts={[a['summary'] for a in c.alerts]}\n{c.out[-3000:]}"


@pytest.mark.timeout(300)
def test_plain_torchrun_nan_is_found_in_the_combined_log(tmp_path: Path) -> None:
    """`rankwatch run -- torchrun --nproc-per-node 2 train.py`, no --tee: the workers' step lines
    carry no rank prefix, so they go to the run's pipeline, which finds the NaN at its step."""
    c = run_cell(
        tmp_path, torchrun(2), {"FAULT": "nan", "FAULT_RANK": "0", "FAULT_STEP": "12", "STEPS": "20"}
    )
    nan = c.of("nan_loss")
    assert nan and nan[0]["step"] == 12, _debug(c)
    assert c.rc == 0, _debug(c)
    assert not c.of("crash") and not c.of("process_exit"), _debug(c)
    [alert] = c.alerts_of("nan_loss")  # one alert, whatever the later NaN steps (it updates)
    assert alert["step"] >= 12 and "nan_loss" in alert["summary"], alert


@pytest.mark.timeout(300)
def test_plain_torchrun_healthy_run_ends_silent(tmp_path: Path) -> None:
    """Two healthy workers to the end under torchrun: their exit status is torchrun's to tell
    (exit 0): no crash, no "exit status unknown", no alert."""
    c = run_cell(tmp_path, torchrun(2), {"FAULT": "none", "STEPS": "15"})
    assert c.rc == 0, _debug(c)
    serious = [f for f in c.findings if f["severity"] != "info" and not f.get("resolved")]
    assert not serious and not c.of("process_exit"), _debug(c)
    assert not c.alerts, _debug(c)


@pytest.mark.timeout(300)
def test_torchrun_restart_reports_the_first_attempts_crash(tmp_path: Path) -> None:
    """`run -- torchrun --max-restarts 1`, rank 1 raises once at step 6: that crash is reported
    (the old worker's end is judged before the new one is attached), and the job's clean end
    after the restart is no crash."""
    env = {"FAULT": "raise", "FAULT_RANK": "1", "FAULT_STEP": "6", "STEPS": "12", "DIST": "0"}
    c = run_cell(tmp_path, torchrun(2, "--max-restarts", "1"), env)
    assert c.rc == 0, _debug(c)
    crashes = [f for f in c.of("crash") if f["rank"] == 1]
    assert len(crashes) == 1, _debug(c)
    assert "rank 1 hit a bad batch at step 6" in crashes[0]["message"], _debug(c)
    assert "exit code 1" in crashes[0]["message"] or "code 1" in crashes[0]["message"], _debug(c)
    # Rank 0 was stopped by the launcher after rank 1 failed: no crash of its own.
    assert not [f for f in c.of("crash") if f["rank"] != 1], _debug(c)
    assert not [f for f in c.findings if f["kind"] == "process_exit" and "unknown" in f["message"]], _debug(c)
    alert = next(a for a in c.alerts_of("crash") if a["rank"] == 1 or a["suspect"] == 1)
    assert "crash" in alert["summary"], alert


@pytest.mark.timeout(300)
def test_plain_torchrun_a_rank_that_leaves_early_is_named(tmp_path: Path) -> None:
    """Rank 1 returns from main with status 0 at step 8 while rank 0 enters the next collective:
    rank 0's gloo `Connection closed by peer` is a consequence, named after rank 1; the alerts'
    suspect is rank 1; the agent exits with torchrun's status."""
    env = {"FAULT": "exit", "FAULT_RANK": "1", "FAULT_STEP": "8", "STEPS": "40"}
    c = run_cell(tmp_path, torchrun(2), env)
    assert "rank 1 leaves early at step 8" in c.log, _debug(c)
    assert c.rc == 1, _debug(c)  # torchrun's: rank 0 failed
    blamed = [f for f in c.findings if f["rank"] == 0 and f["kind"] in ("crash", "peer_error")]
    assert blamed, _debug(c)
    for f in blamed:
        assert f["message"].startswith("rank 1 failed first: exited with status 0"), _debug(c)
        assert f["diagnosis"]["suspect"] == 1 and f["diagnosis"]["first_failure"]["kind"] == "exit", f
    assert not [f for f in c.of("crash") if f["rank"] == 1], _debug(c)
    firing = [a for a in c.alerts if a["status"] == "firing"]
    assert firing and all(a["suspect"] == 1 for a in firing), [(a["summary"], a["suspect"]) for a in firing]
    assert all("suspect rank 1" in a["summary"] for a in firing), [a["summary"] for a in firing]


# --- the node daemon: `watch --match`, two users' jobs --------------------------------------


def _job(out: Path, run: str, tag: str, *, user: int | None, steps: int = 400) -> subprocess.Popen[bytes]:
    """One single-rank job (rank 0 of its own world), NaN from step 10, its stdout a file as
    Slurm's --output makes it; as another user with ``setpriv`` when ``user`` is given."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RW_TEST_TAG=tag, DIST="0", FAULT="nan", FAULT_RANK="0")
    env.update(FAULT_STEP="10", STEPS=str(steps), STEP_S="0.05", SLURM_JOB_ID=run, RANK="0", WORLD_SIZE="1")
    env.update(LOCAL_RANK="0", PYTHONUNBUFFERED="1")
    out.touch()
    cmd = [sys.executable, str(WORKLOAD), "--node-daemon-test"]
    if user is not None:
        os.chown(out, user, user)
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    with open(out, "ab") as fh:
        return subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="two users' jobs need root for setpriv")
def test_node_daemon_keeps_two_users_jobs_apart_and_a_new_job_is_a_new_pipeline(tmp_path: Path) -> None:
    """One `watch --match` on a node running job A (root) and job B (nobody), both rank 0 going
    NaN at step 10: two nan_loss findings and two alerts, each with its own run and user. Job A
    ends and job C starts on the same rank numbers: a new pipeline, whose NaN is reported."""
    srv, got = _receiver()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    tag = uuid.uuid4().hex
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        "stall: {startup_grace: 120s, floor: 30s}\nprocess: {sample_interval: 250ms}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\nserver: {{enabled: false}}\ngpu: {{enabled: false}}\n"
        f"alerts: {{startup_quiet: 0s, group_wait: 1s, spool_dir: {tmp_path / 'spool'}, board_dir: '',"
        f" webhook: {{urls: ['{url}']}}}}\n"
    )
    found = tmp_path / "f.jsonl"
    agent = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", "watch", "--config", str(cfg), "--match=--node-daemon-test",
         "--findings-jsonl", str(found)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []

    def nans() -> list[dict[str, Any]]:
        rows = [json.loads(x) for x in found.read_text().splitlines() if x.strip()] if found.exists() else []
        return [f for f in rows if f["kind"] == "nan_loss" and not f.get("resolved")]

    def wait(what: str, check: Any, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got_ = check()
            if got_:
                return got_
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {nans()}")

    try:
        a = _job(jobs / "a.out", "9001", tag, user=None, steps=60)
        b = _job(jobs / "b.out", "9002", tag, user=65534)
        procs += [a, b]
        wait("NaN of both jobs", lambda: {f["run"] for f in nans()} >= {"9001", "9002"})
        seen = sorted((f["run"], f["rank"], f["step"]) for f in nans())
        assert seen == [("9001", 0, 10), ("9002", 0, 10)], [(f["run"], f["path"], f["line"]) for f in nans()]
        wait(
            "two nan_loss alerts", lambda: len({a_["run"] for a_ in got if a_["kind"] == "nan_loss"}) == 2, 30
        )
        a.wait(timeout=120)  # job A runs to its end
        c = _job(jobs / "c.out", "9003", tag, user=None)
        procs.append(c)
        wait("NaN of the next job on the same rank", lambda: "9003" in {f["run"] for f in nans()})
    finally:
        agent.terminate()
        try:
            agent.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.communicate()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
            p.wait(timeout=10)
        srv.shutdown()
    alerts = [a_ for a_ in got if a_["kind"] == "nan_loss" and a_["status"] == "firing"]
    assert sorted({a_["run"] for a_ in alerts}) == ["9001", "9002", "9003"], [a_["summary"] for a_ in alerts]
    assert not _job_processes(tag)


# --- more cells: run -- torchrun (plain and --tee 3) x OOM, SIGKILL, NaN -----------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("form", "fault", "kind"),
    [
        ("plain", "oom", "oom"),
        ("plain", "sigkill", "crash"),
        ("tee", "oom", "oom"),
        ("tee", "sigkill", "crash"),
    ],
)
def test_torchrun_a_failing_rank_is_named_by_its_peer(
    tmp_path: Path, form: str, fault: str, kind: str
) -> None:
    """Rank 1 fails at step 8 (a CUDA OOM exception's text, or SIGKILL as the OOM killer sends
    it): its failure is reported on rank 1 (the launcher's account gives a killed worker its
    signal), rank 0's gloo error is named after it, every alert's suspect is rank 1, and the agent
    exits with torchrun's status."""
    extra = ("--tee", "3") if form == "tee" else ()
    env = {"FAULT": fault, "FAULT_RANK": "1", "FAULT_STEP": "8", "STEPS": "40"}
    c = run_cell(tmp_path, torchrun(2, *extra), env)
    assert c.rc == 1, _debug(c)
    own = [
        f for f in c.findings if f["rank"] == 1 and f["kind"] in ("crash", "oom") and not f.get("resolved")
    ]
    assert own, _debug(c)
    text = " ".join(f["message"] for f in own)
    assert ("CUDA out of memory" in text) if fault == "oom" else ("SIGKILL" in text or "signal 9" in text), (
        _debug(c)
    )
    for f in c.findings:
        if f["rank"] == 0 and f["kind"] in ("crash", "peer_error") and not f.get("resolved"):
            assert f["message"].startswith("rank 1 failed first"), _debug(c)
    firing = [a for a in c.alerts if a["status"] == "firing"]
    assert firing and all(a["suspect"] == 1 for a in firing), [(a["summary"], a["suspect"]) for a in firing]


@pytest.mark.timeout(300)
def test_torchrun_tee_nan_is_found_on_its_rank(tmp_path: Path) -> None:
    """With --tee 3 every worker line carries its prefix: the NaN is found on the rank that
    printed it, at its step."""
    env = {"FAULT": "nan", "FAULT_RANK": "0", "FAULT_STEP": "12", "STEPS": "20"}
    c = run_cell(tmp_path, torchrun(2, "--tee", "3"), env)
    assert c.rc == 0, _debug(c)
    first = {f["rank"]: f["step"] for f in reversed(c.of("nan_loss"))}
    assert first.get(0) == 12, _debug(c)
    assert not c.of("crash") and not [f for f in c.findings if "unknown" in f["message"]], _debug(c)
