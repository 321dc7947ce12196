"""deploy/slurm on a real one-node Slurm: the sbatch scripts users copy, not a mock of them.

A private slurmctld + slurmd + munged (tests/slurm/slurm-single-node-up.sh) run in a temp
folder on ports chosen here; the fake trainer hangs one rank, and the agents must report it,
capture every rank's stack into one incident, and leave nothing behind when the job ends.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from conftest import free_port
from torchjobs import (
    WORKLOAD,
    Running,
    _popen,
    _term,
    agent_config,
    finish,
    job_env,
    rankwatch,
    systemd_notify,
    webhook,
)

REPO = Path(__file__).resolve().parents[1]
UP = REPO / "tests" / "slurm" / "slurm-single-node-up.sh"
DOWN = REPO / "tests" / "slurm" / "slurm-single-node-down.sh"
TRAIN_SBATCH = REPO / "deploy" / "slurm" / "train.sbatch"
WATCH_SBATCH = REPO / "deploy" / "slurm" / "watch.sbatch"
PROGRAMS = ("slurmctld", "slurmd", "munged", "munge", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
SBIN = ("/usr/sbin", "/sbin")

T = TypeVar("T")


def _path_with_sbin() -> str:
    parts = [str(Path(sys.executable).parent), *os.environ.get("PATH", "").split(os.pathsep)]
    parts += [d for d in SBIN if d not in parts]
    return os.pathsep.join(parts)


def _require_slurm() -> None:
    path = _path_with_sbin()
    missing = [p for p in PROGRAMS if shutil.which(p, path=path) is None]
    if missing:
        pytest.skip(
            f"Slurm/munge not installed ({', '.join(missing)}; Debian: apt-get install -y slurm-wlm munge)"
        )
    if os.geteuid() != 0:
        pytest.skip("the one-node Slurm test cluster runs slurmd as root")


def _free_ports(n: int) -> int:
    """A first port such that it and the n-1 after it are free on loopback now."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            first = s.getsockname()[1]
        if first + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for p in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free loopback ports")


def _wait(pred: Callable[[], T], timeout: float, what: str, diag: Callable[[], str] = lambda: "") -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{diag()}")


def _get(url: str) -> str | None:
    from rankwatch.server.tokenfile import read_token

    token = read_token()  # the agents under srun inherit this test's runtime folder
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=3) as r:
            return r.read().decode()
    except OSError:
        return None


def _get_json(url: str) -> Any:
    text = _get(url)
    return None if text is None else json.loads(text)


def _ours(marker: str) -> list[psutil.Process]:
    """Live processes of this test: their command line names its temp folder."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["pid"] == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(marker in a for a in p.info["cmdline"] or ()):
            found.append(p)
    return found


def _kill_ours(marker: str) -> None:
    for p in _ours(marker):
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    _require_slurm()
    # short path: slurmd puts unix sockets in its spool folder (108-byte limit)
    d = Path(tempfile.mkdtemp(prefix="rw-slurm-"))
    ctld = _free_ports(2)
    env = dict(
        os.environ,
        PATH=_path_with_sbin(),
        SLURM_TEST_DIR=str(d),
        SLURM_TEST_CTLD_PORT=str(ctld),
        SLURM_TEST_SLURMD_PORT=str(ctld + 1),
    )
    try:
        up = subprocess.run(["bash", str(UP)], env=env, capture_output=True, text=True, timeout=60)
        assert up.returncode == 0, f"slurm-single-node-up.sh failed:\n{up.stdout}\n{up.stderr}"
        assert f"export SLURM_CONF={d}/slurm.conf" in up.stdout, up.stdout
        env["SLURM_CONF"] = str(d / "slurm.conf")
        yield env
    finally:
        subprocess.run(["bash", str(DOWN)], env=env, capture_output=True, timeout=90)
        pids = []
        for name in ("slurmctld.bgpid", "slurmd.bgpid", "munge/munged.pid"):
            f = d / name
            if f.is_file() and f.read_text().strip().isdigit():
                pids.append(int(f.read_text()))

        def daemons_gone() -> bool:
            for pid in pids:
                try:
                    if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                        return False
                except psutil.NoSuchProcess:
                    pass
            return True

        _wait(daemons_gone, 20, "the test cluster's daemons to stop")
        _kill_ours(str(d))
        shutil.rmtree(d, ignore_errors=True)


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        "detectors: {warmup_steps: 5}\n"
        "stall: {startup_grace: 20s, floor: 2s, factor: 10}\n"
        "process: {sample_interval: 200ms}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\n"
        "gpu: {enabled: false}\n"
    )
    return cfg


def _sbatch(env: dict[str, str], script: Path, tmp_path: Path, *cmd: str) -> str:
    args = [
        "sbatch", "--parsable", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
        "--time=10", f"--output={tmp_path / 'job.out'}", f"--chdir={tmp_path}", str(script), *cmd,
    ]  # fmt: skip
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def _trainer(tmp_path: Path, *extra: str) -> list[str]:
    sync = tmp_path / "sync"
    sync.mkdir()
    return [
        sys.executable, "-m", "rankwatch.demo.trainer", "--steps", "100000", "--step-time", "0.05",
        "--format", "megatron", "--sync-dir", str(sync), "--fault", "hang@40:rank=1", *extra,
    ]  # fmt: skip


def _job_state(env: dict[str, str], jid: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", jid], env=env, capture_output=True, text=True, timeout=10
    )
    m = re.search(r"JobState=(\S+)", out.stdout)
    return m.group(1) if m else "GONE"


def _step_value(metrics: str, rank: int, run: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith("rankwatch_step{") and f'rank="{rank}"' in line and f'run="{run}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _stalled(base: str, rank: int) -> bool:
    found = _get_json(f"{base}/api/findings?kind=stall&rank={rank}")
    return bool(found) and any(f["rank"] == rank for f in found["findings"])


def _incident_with(dumps: Path, run: str, ranks: tuple[int, ...]) -> Path | None:
    for inc in sorted((dumps / run).glob("*_stall")):
        if all((inc / f"rank-{r}.txt").is_file() and (inc / f"rank-{r}.txt").stat().st_size for r in ranks):
            return inc
    return None


def _cleanup_job(env: dict[str, str], jid: str | None, marker: str) -> None:
    if jid:
        for args in (["scancel", "--full", "--signal=KILL", jid], ["scancel", jid]):
            subprocess.run(args, env=env, capture_output=True, timeout=15)
    try:
        _wait(lambda: not _ours(marker), 15, "the job's processes to end")
    finally:
        _kill_ours(marker)


def _job_env(slurm: dict[str, str], tmp_path: Path, sd: Path) -> dict[str, str]:
    """No RANKWATCH_PORT: the scripts' default, a reserved or free port per agent."""
    return dict(
        slurm,
        RANKWATCH_CONFIG=str(_config(tmp_path)),
        RANKWATCH_BIND="127.0.0.1",
        RANKWATCH_SD_DIR=str(sd),
        RANKWATCH_LOG_DIR=str(tmp_path / "logs"),
        # this test's runtime folder (the module's cluster was started under another test's):
        # the agents keep their token there, where _get reads it
        XDG_RUNTIME_DIR=os.environ["XDG_RUNTIME_DIR"],
    )


def _sd_targets(sd: Path, jid: str) -> dict[str, list[str]]:
    """file name -> its targets, for the job's file_sd files."""
    out = {}
    for f in sorted(sd.glob(f"slurm-{jid}-*.json")):
        doc = json.loads(f.read_text())
        assert len(doc) == 1 and doc[0]["labels"]["slurm_job_id"] == jid, doc
        out[f.name] = doc[0]["targets"]
    return out


def _agent_bases(sd: Path, jid: str, names: list[str], diag: Callable[[], str]) -> list[str]:
    """The agents' URLs, from the addresses they wrote into file_sd (one entry each)."""
    targets = _wait(
        lambda: (t := _sd_targets(sd, jid)) and set(t) == set(names) and t, 30, f"file_sd files {names}", diag
    )
    for name, tg in targets.items():
        assert len(tg) == 1, (name, tg)
    return [f"http://{targets[n][0]}" for n in names]


def _tail(out: Path) -> str:
    return out.read_text(errors="replace")[-4000:] if out.exists() else "(no job output)"


@pytest.mark.tool
def test_train_sbatch_run_per_task_stall_dumps_and_scancel(slurm: dict[str, str], tmp_path: Path) -> None:
    """Two `rankwatch run` agents under train.sbatch: metrics per rank, a stall with one
    incident for both ranks, then scancel ends ranks and agents in order."""
    marker = str(tmp_path)
    sd = tmp_path / "sd"
    env = _job_env(slurm, tmp_path, sd)
    out = tmp_path / "job.out"

    def diag() -> str:
        return _tail(out)

    jid = None
    # The fixed port local rank 0 used to take, held by "another job's agent" on this node
    # (or already taken by something else: just as good).
    squatter = socket.socket()
    with contextlib.suppress(OSError):
        squatter.bind(("127.0.0.1", 9478))
        squatter.listen()
    try:
        submitted = time.time()
        jid = _sbatch(env, TRAIN_SBATCH, tmp_path, *_trainer(tmp_path))
        bases = _agent_bases(sd, jid, [f"slurm-{jid}-0.json", f"slurm-{jid}-1.json"], diag)
        assert len(set(bases)) == 2 and all(b.startswith("http://127.0.0.1:") for b in bases), bases
        assert ":9478" not in " ".join(bases)

        def both_stepping() -> bool:
            texts = [_get(b + "/metrics") for b in bases]
            return all(t is not None and (_step_value(t, r, jid) or 0) >= 5 for r, t in enumerate(texts))

        _wait(both_stepping, 30, "both agents' rankwatch_step for rank 0 and 1 with run=<job id>", diag)

        agents = [p for p in _ours(marker) if "run" in p.info["cmdline"] and "--listen" in p.info["cmdline"]]
        assert len(agents) == 2, [p.cmdline() for p in agents]
        end = float(agents[0].environ()["SLURM_JOB_END_TIME"])  # squeue fallback on Slurm < 23.02
        assert abs(end - (submitted + 600)) < 120, (end, submitted)

        incident = _wait(
            lambda: _incident_with(tmp_path / "dumps", jid, (0, 1)), 30, "a stall incident", diag
        )
        assert "wait_for_batch" in (incident / "rank-1.txt").read_text()  # the hung rank's own frame
        # The incident may start from rank 0's stall; rank 1's own timeout (its own step
        # intervals) can expire a poll or two later.
        _wait(lambda: _stalled(bases[1], 1), 15, "rank 1's own stall finding", diag)

        cancelled = time.monotonic()
        subprocess.run(["scancel", jid], env=env, check=True, timeout=15)
        _wait(lambda: not _ours(marker), 15, "ranks and agents to end after scancel", diag)
        took = time.monotonic() - cancelled
        assert took < 5, f"{took:.1f}s: slower than KillWait, so Slurm had to SIGKILL"
        _wait(lambda: _job_state(env, jid) in ("CANCELLED", "GONE"), 15, "the job to end", diag)

        text = diag()
        for r in range(2):
            stopped = r"process stopped on the (SIGTERM we forwarded|forwarded stop signal)"
            assert re.search(rf"\[run={jid} rank={r}\] INFO process_exit .*{stopped}", text), text
        assert not re.search(r"CRITICAL crash|SIGKILL|Traceback", text), text
        _wait(lambda: not _sd_targets(sd, jid), 10, "the file_sd files to be removed", diag)
        assert not list(sd.iterdir()), list(sd.iterdir())
    finally:
        squatter.close()
        _cleanup_job(env, jid, marker)


@pytest.mark.tool
def test_watch_sbatch_per_node_sidecar_sees_both_ranks(slurm: dict[str, str], tmp_path: Path) -> None:
    """One `rankwatch watch` step (srun --overlap) beside a two-rank step: both ranks in its
    metrics, a stall with both stacks, the peer's NCCL-style timeout, and the job ending by
    itself (kill-on-bad-exit) with the agent stopped by the script."""
    marker = str(tmp_path)
    sd = tmp_path / "sd"
    env = _job_env(slurm, tmp_path, sd)
    out = tmp_path / "job.out"

    def diag() -> str:
        return _tail(out)

    jid = None
    try:
        jid = _sbatch(env, WATCH_SBATCH, tmp_path, *_trainer(tmp_path, "--collective-timeout", "10"))
        (base,) = _agent_bases(sd, jid, [f"slurm-{jid}-node0.json"], diag)

        def both_ranks() -> bool:
            t = _get(base + "/metrics")
            return t is not None and all((_step_value(t, r, jid) or 0) >= 5 for r in range(2))

        _wait(both_ranks, 30, "rankwatch_step for ranks 0 and 1 from the one node agent", diag)
        status = _get_json(base + "/readyz")
        assert status is not None
        incident = _wait(
            lambda: _incident_with(tmp_path / "dumps", jid, (0, 1)), 30, "a stall incident", diag
        )
        assert "wait_for_batch" in (incident / "rank-1.txt").read_text()
        _wait(lambda: _stalled(base, 1), 15, "rank 1's own stall finding", diag)

        # rank 0 gives up after --collective-timeout, --kill-on-bad-exit ends rank 1, the
        # script stops the agent: the job ends without scancel.
        _wait(
            lambda: _job_state(env, jid) not in ("RUNNING", "PENDING", "COMPLETING"),
            40,
            "the job's end",
            diag,
        )
        _wait(lambda: not _ours(marker), 10, "ranks and agent to be gone", diag)
        text = diag()
        assert re.search(rf"\[run={jid} rank=0\] CRITICAL nccl_timeout", text), text
        m = re.search(r"watch\.sbatch: training exited with status (\d+), agents with status (\d+)", text)
        assert m and m.group(1) != "0", text
        # The agent ends on SIGTERM with status 0 when the script stops it. Slurm may cancel the
        # overlapping agent step itself as the training step is killed on its bad exit (a race
        # inside Slurm: "STEP n.m CANCELLED" for the agent's step); srun then reports 143.
        cancelled = re.search(r"STEP \d+\.\d+ ON \S+ CANCELLED", text) is not None
        assert m.group(2) == "0" or (cancelled and m.group(2) == "143"), text
        assert _job_state(env, jid) in ("FAILED", "GONE")
        assert not _sd_targets(sd, jid)
    finally:
        _cleanup_job(env, jid, marker)


@pytest.mark.tool
@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch not installed")
def test_the_node_daemon_beside_a_plain_srun_step_pages_the_aborted_task(
    slurm: dict[str, str], tmp_path: Path
) -> None:
    """The node daemon (``watch --match``, as systemd runs it) beside ``srun -n 2 python
    train.py`` with no agent in the step (s39 k63): srun's command line matches too, but it is
    the step's launcher, not a rank; the tasks' output reaches the user through srun's (a
    pipe to slurmstepd in each task), so srun's file is the tasks' log, and srun's "task 1:
    Aborted" is rank 1's death. Rank 1 aborts (no traceback), rank 0 dies of the lost peer:
    one alert, "crash on rank 1", suspect rank 1, of run <job id>."""
    tag = uuid.uuid4().hex
    with webhook() as (url, posted):
        cfg = agent_config(tmp_path, url=url, named=False)
        found = tmp_path / "f.jsonl"
        watch = rankwatch(
            "watch", "--config", str(cfg), f"--match=--rw-job={tag}", "--findings-jsonl", str(found)
        )
        with systemd_notify() as (notify_env, ready):
            agent = _popen(watch, job_env(tag, notify_env), tmp_path / "agent.out")
            ready(agent, tmp_path / "agent.out")
        env = job_env(
            tag,
            {
                **{k: v for k, v in slurm.items() if k in ("PATH", "SLURM_CONF")},
                "FAULT": "abort", "FAULT_RANK": "1", "FAULT_STEP": "10", "MASTER_PORT": str(free_port()),
            },
        )  # fmt: skip
        train = [sys.executable, "-u", str(WORKLOAD), f"--rw-job={tag}"]
        step = _popen(["srun", "-n", "2", f"--chdir={tmp_path}", *train], env, tmp_path / "train.out")
        running = Running(
            tag, [step], step.poll, lambda: _term([step]), [found], lambda: [],
            [tmp_path / "train.out", tmp_path / "agent.out"], [agent],
        )  # fmt: skip
        running.stop_agents = lambda: _term([agent])
        cell = finish(running, tmp_path, posted)
    out = (tmp_path / "train.out").read_text(errors="replace")
    assert "task 1: Aborted" in out, cell.debug()
    jid = next(f["run"] for f in cell.findings if f["rank"] == 1)
    assert jid.isdigit(), cell.debug()  # the Slurm job id, read from the task's environment
    assert cell.rc not in (0, None), cell.debug()
    assert cell.extra["agent_rcs"] == [0], cell.debug()
    assert not [f for f in cell.serious() if f["rank"] is None], cell.debug()  # srun is no rank
    assert cell.on(1, "crash"), cell.debug()
    (alert,) = cell.firing()
    got = (alert["kind"], alert["rank"], alert["suspect"], alert["run"], alert["world_size"])
    assert got == ("crash", 1, 1, jid, 2), cell.debug()


@pytest.mark.tool
def test_sbatch_scripts_pass_shellcheck() -> None:
    sc = shutil.which("shellcheck")
    if sc is None:
        pytest.skip("shellcheck not installed (Debian: apt-get install -y shellcheck)")
    scripts = [TRAIN_SBATCH, WATCH_SBATCH, UP, DOWN, *sorted((REPO / "deploy" / "slurm").glob("*.sh"))]
    out = subprocess.run([sc, "-s", "bash", *map(str, scripts)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout


@pytest.mark.tool
def test_watch_sbatch_scancel_ends_ranks_and_the_node_agent(slurm: dict[str, str], tmp_path: Path) -> None:
    """The per-node form under scancel: training step and `srun --overlap` agent both end
    promptly, nothing of the job is left running, and the agent reports no crash."""
    marker = str(tmp_path)
    sd = tmp_path / "sd"
    env = _job_env(slurm, tmp_path, sd)
    out = tmp_path / "job.out"

    def diag() -> str:
        return _tail(out)

    jid = None
    try:
        jid = _sbatch(env, WATCH_SBATCH, tmp_path, *_trainer(tmp_path))
        (base,) = _agent_bases(sd, jid, [f"slurm-{jid}-node0.json"], diag)

        def both_ranks() -> bool:
            t = _get(base + "/metrics")
            return t is not None and all((_step_value(t, r, jid) or 0) >= 5 for r in range(2))

        _wait(both_ranks, 30, "rankwatch_step for ranks 0 and 1 from the one node agent", diag)
        agents = [p for p in _ours(marker) if "watch" in p.info["cmdline"]]
        assert agents, "no rankwatch watch process"

        cancelled = time.monotonic()
        subprocess.run(["scancel", jid], env=env, check=True, timeout=15)
        _wait(lambda: not _ours(marker), 15, "ranks and the node agent to end after scancel", diag)
        took = time.monotonic() - cancelled
        assert took < 5, f"{took:.1f}s: slower than KillWait, so Slurm had to SIGKILL"
        _wait(lambda: _job_state(env, jid) in ("CANCELLED", "GONE"), 15, "the job to end", diag)
        assert not re.search(r"CRITICAL crash|Traceback", diag()), diag()
    finally:
        _cleanup_job(env, jid, marker)


# --- ports ------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("env", "listen", "expected"),
    [
        ({}, "127.0.0.1:auto", "127.0.0.1:0"),
        ({"SLURM_STEP_RESV_PORTS": "12000-12003", "SLURM_LOCALID": "2"}, "0.0.0.0:auto", "0.0.0.0:12002"),
        ({"SLURM_STEP_RESV_PORTS": "12000,12005-12006", "SLURM_LOCALID": "2"}, "[::]:auto", "[::]:12006"),
        # more local tasks than reserved ports: any free port rather than a neighbour's
        ({"SLURM_STEP_RESV_PORTS": "12000-12001", "SLURM_LOCALID": "3"}, ":auto", ":0"),
        ({"SLURM_STEP_RESV_PORTS": "12000-12001"}, "127.0.0.1:9478", "127.0.0.1:9478"),
    ],
)
def test_listen_auto_takes_the_steps_reserved_port(env: dict[str, str], listen: str, expected: str) -> None:
    from rankwatch.slurm import resolve_listen

    assert resolve_listen(listen, env) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("line", "tasks"),
    [
        ("srun: error: vm: task 1: Aborted", {1}),
        ("srun: error: n01: tasks 0-2,5: Exited with exit code 1", {0, 1, 2, 5}),
        ("srun: error: n01: task 3: Killed", {3}),
        ("srun: Job step aborted: Waiting up to 32 seconds for job step to finish.", None),
        ("[rank0]: srun: error: vm: task 1: Aborted", None),  # a rank's own print, not srun's
    ],
)
def test_srun_lines_name_the_tasks_whose_end_they_tell(line: str, tasks: set[int] | None) -> None:
    """srun's account of its tasks' ends: the first as Slurm 22.05 printed it here
    (tests/data/blackbox/s39/repro/k63/train.out), the others in the shape of its task-state
    report (a range list of task ids, src/srun/task_state.c)."""
    from rankwatch.slurm import named_tasks

    assert named_tasks(line) == tasks
