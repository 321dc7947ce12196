"""Real PyTorch jobs (CPU, gloo) under rankwatch, launched the way users launch them: the one
harness of the tool-tier tests that run ``tests/workloads/ddp_train.py`` (test_launch_matrix,
test_ddp_real).

Every process a job starts carries ``RW_TEST_TAG`` in its environment, so a test can find
what is left of it (DataLoader workers, a launcher's ranks, a sidecar in its own PID
namespace) and assert that nothing is; alerts go to a loopback webhook (``faultlib.webhook``)
on a port chosen at run time; every wait is bounded (``conftest.wait_for``).

A launch form is a function that starts the job and returns a :class:`Running`: the processes
to wait for, how a user stops the job (SIGTERM where the user would send it), which exit
status is the one the user sees, and where the findings are written. :func:`finish` runs it to
its end (or, for a hang, until the findings show it, then stops it) and returns a :class:`Cell`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from conftest import free_port, wait_for
from faultlib import webhook  # noqa: F401 - the webhook of every cell: with webhook() as (url, posted)

WORKLOAD = Path(__file__).parent / "workloads" / "ddp_train.py"
# Every test file that starts real torch jobs: ``pytestmark = REAL_TORCH``.
REAL_TORCH = [
    pytest.mark.tool,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="PyTorch not installed (CI installs torch==2.13.0)"
    ),
]
# A rank's identity from the test runner's own environment would leak into the job.
JOB_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK", "PMI_RANK",
)  # fmt: skip
RUN_S = 240.0  # two ranks import torch on two busy cores, then tens of 50 ms steps
# A killed rank's DataLoader worker notices its parent is gone within PyTorch's
# MP_STATUS_CHECK_INTERVAL (5 s, torch/utils/data/_utils/__init__.py) and exits on its own.
WORKER_GONE_S = 10.0
# The Helm chart's sidecar: `watch --match <sidecar.match> --log /logs/rank-$(RANK).log`
# (helm/rankwatch/values.yaml), the trainer's output tee'd into that file.
SIDECAR_MATCH = r"(^|/)python[0-9.]*\s"
SIDECAR_TRAINER = 'exec > >(tee -a "$LOGS/rank-${{RANK}}.log") 2>&1; exec {python} -u {workload}'


def job_env(tag: str, env: dict[str, str]) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k not in JOB_VARS}
    out.update(OMP_NUM_THREADS="1", RW_TEST_TAG=tag, STEP_S="0.05", PYTHONUNBUFFERED="1")
    out.update(env)
    return out


def rankwatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "rankwatch", *args]


def torchrun(world: int = 2, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master-port",
            str(free_port()), "--nproc-per-node", str(world), *extra]  # fmt: skip


def job_processes(tag: str) -> list[psutil.Process]:
    """Every live process started for the job tagged ``tag`` (they inherit the tag)."""
    out = []
    me = os.getpid()
    for p in psutil.process_iter():
        try:
            if p.pid != me and p.environ().get("RW_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def reap_leftovers(tag: str, grace: float = WORKER_GONE_S) -> list[int]:
    """Wait (bounded) for what is left of the job to end on its own; kill what does not and
    return its pids (a test asserts there are none)."""
    with contextlib.suppress(AssertionError):
        wait_for(lambda: not job_processes(tag), grace, interval=0.2)
    left = job_processes(tag)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return [p.pid for p in left]


def read_jsonl(paths: Sequence[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            rows += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return rows


def agent_config(
    tmp: Path,
    *,
    url: str | None = None,
    floor: str = "4s",
    extra: str = "",
    board: bool | None = False,
    named: bool = True,
    stall: str = "",
    grace: str = "120s",
) -> Path:
    """The agents' config: a short stall floor (the workload steps every ~50 ms), the loopback
    webhook, and a run folder shared by the agents of one job when there are several
    (``board``: one alert per problem between them; None: ``alerts.board_dir`` not set, as a
    user's config has it: the board in the run folder under ``dumps.dir``). ``named``: the run's
    name is the one the user chose (``run.name``); else each job's is read from its processes (Slurm's job id,
    torchrun's run id), by the node daemon and under ``run -- torchrun`` alike. ``stall``: more
    keys of the stall rule (``", silent_rank_timeout: 10s"``); ``grace``: its startup grace."""
    cfg = tmp / "rw.yaml"
    alerts = ""
    if url is not None:
        board_dir = "" if board is None else f" board_dir: {tmp / 'board' if board else repr('')},"
        alerts = (
            f"alerts: {{startup_quiet: 0s, group_wait: 1s, spool_dir: {tmp / 'spool'},"
            f"{board_dir} webhook: {{urls: ['{url}']}}}}\n"
        )
    cfg.write_text(
        (f"run: {{name: job-{uuid.uuid4().hex[:8]}}}\n" if named else "")
        + f"stall: {{startup_grace: {grace}, floor: {floor}, factor: 10{stall}}}\n"
        "process: {sample_interval: 250ms}\n"
        f"dumps: {{dir: {tmp / 'dumps'}}}\n"
        f"runner: {{log_dir: {tmp / 'logs'}, term_grace: 3s, echo: false}}\n"
        "server: {enabled: false}\ngpu: {enabled: false}\n" + alerts + extra
    )
    return cfg


@dataclass
class Cell:
    """What a user sees of one job: the agents' findings, the alerts the webhook received, the
    exit status of what the user started, and the job's output."""

    tmp: Path
    rc: int | None
    findings: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    log: str
    out: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.findings if f["kind"] == kind and not f.get("resolved")]

    def on(self, rank: int | None, *kinds: str) -> list[dict[str, Any]]:
        return [
            f for f in self.findings if f["rank"] == rank and f["kind"] in kinds and not f.get("resolved")
        ]

    def alerts_of(self, kind: str) -> list[dict[str, Any]]:
        return [a for a in self.alerts if a["kind"] == kind and a["status"] == "firing"]

    def firing(self) -> list[dict[str, Any]]:
        return [a for a in self.alerts if a["status"] == "firing"]

    def serious(self) -> list[dict[str, Any]]:
        return [f for f in self.findings if f["severity"] != "info" and not f.get("resolved")]

    def debug(self) -> str:
        rows = [(f["kind"], f["rank"], f["step"], f["message"][:200]) for f in self.findings]
        alerts = [(a["status"], a["kind"], a["rank"], a["suspect"], a["summary"]) for a in self.alerts]
        return f"rc={self.rc}\nfindings={rows}\nalerts={alerts}\n{self.out[-3000:]}"


@dataclass
class Running:
    """A job as started by a launch form."""

    tag: str
    procs: list[subprocess.Popen[bytes]]  # what the user started, waited for to the end
    status: Callable[[], int | None]  # the exit status the user sees
    stop: Callable[[], None]  # how the user stops it (a hang)
    findings: list[Path]
    logs: Callable[[], list[Path]]
    outs: list[Path] = field(default_factory=list)
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)  # their exit status is asserted
    # An agent that goes on when the job's processes are gone (a sidecar): how it is stopped
    # (Kubernetes sends a native sidecar SIGTERM once the main containers have exited).
    stop_agents: Callable[[], None] | None = None
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        return read_jsonl(self.findings)

    def ended(self) -> bool:
        return all(p.poll() is not None for p in self.procs)


def _popen(
    cmd: list[str], env: dict[str, str], out: Path, *, session: bool = False
) -> subprocess.Popen[bytes]:
    with open(out, "ab") as fh:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=session,
        )


def _term_groups(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Ctrl-C as a shell delivers it: to the whole process group (DataLoader workers too)."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)


def _term(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)


def finish(
    running: Running,
    tmp: Path,
    posted: list[str],
    *,
    hang: Callable[[list[dict[str, Any]]], Any] | None = None,
    timeout: float = RUN_S,
) -> Cell:
    """Run ``running`` to its end: for a hang, until ``hang(findings)`` holds, then the user's
    stop. Then the agents' own end, and nothing of the job left running."""
    try:
        if hang is not None:
            wait_for(lambda: hang(running.rows()) or running.ended(), timeout, "the hang to be found", 0.25)
            # The user stops a hung job once the alert is in.
            with contextlib.suppress(AssertionError):
                wait_for(lambda: '"firing"' in "".join(posted), 30, "the hang's alert", 0.25)
            running.stop()
        for p in running.procs:
            p.wait(timeout=timeout)
        if running.stop_agents is not None:
            running.stop_agents()
        for p in running.agents:
            p.wait(timeout=60)
    except BaseException:
        # A failed cell leaves no job behind: a hung rank's workers outlive a killed launcher.
        reap_leftovers(running.tag, grace=0)
        raise
    finally:
        for p in [*running.procs, *running.agents]:
            if p.poll() is None:
                p.kill()
        for fn in running.cleanup:
            fn()
    left = reap_leftovers(running.tag)
    text = "".join(p.read_text(errors="replace") for p in running.logs())
    out = "".join(p.read_text(errors="replace")[-2000:] for p in running.outs if p.exists())
    cell = Cell(tmp, running.status(), running.rows(), [json.loads(b) for b in posted], text, out)
    cell.extra["agent_rcs"] = [p.returncode for p in running.agents]
    assert not left, f"left running: {left}\n{cell.debug()}"
    return cell


# --- launch forms -------------------------------------------------------------------------------


def run_launcher(
    tmp: Path, cfg: Path, launcher: list[str], env: dict[str, str], workload: Path = WORKLOAD
) -> Running:
    """``rankwatch run -- <launcher> ddp_train.py``: one agent for the whole launcher."""
    tag = uuid.uuid4().hex
    found = tmp / "f.jsonl"
    cmd = rankwatch(
        "run", "--config", str(cfg), "--findings-jsonl", str(found), "--", *launcher, str(workload)
    )
    agent = _popen(cmd, job_env(tag, env), tmp / "agent.out")
    return Running(
        tag, [agent], agent.poll, lambda: _term([agent]), [found],
        lambda: sorted(tmp.rglob("*.log")), [tmp / "agent.out"],
    )  # fmt: skip


def run_script(tmp: Path, cfg: Path, script: Path, env: dict[str, str]) -> Running:
    """``rankwatch run -- python script.py``: one agent for a script that may start its other
    ranks itself (Lightning's subprocess launcher)."""
    tag = uuid.uuid4().hex
    found = tmp / "f.jsonl"
    cmd = rankwatch(
        "run", "--config", str(cfg), "--findings-jsonl", str(found), "--", sys.executable, str(script)
    )
    agent = _popen(cmd, job_env(tag, env), tmp / "agent.out")
    return Running(
        tag, [agent], agent.poll, lambda: _term([agent]), [found],
        lambda: sorted((tmp / "logs").glob("*.log")), [tmp / "agent.out"],
    )  # fmt: skip


def run_wrapper(
    tmp: Path, cfg: Path, launcher: list[str], env: dict[str, str], *, script: bool, exec_: bool = False
) -> Running:
    """``rankwatch run`` on a command that runs the launcher without being it: ``bash -c 'cd . &&
    torchrun ...'`` (bash stays torchrun's parent), ``exec_``: ``bash -c 'exec torchrun ...'``
    (torchrun replaces bash: the agent's child, its command line not the one given), or
    ``script``: ``bash launch.sh``, a user's
    wrapper that runs torchrun (not exec) and then ``echo``, so it exits 0 whatever torchrun
    did. The status the user sees is the wrapper's."""
    tag = uuid.uuid4().hex
    found = tmp / "f.jsonl"
    line = shlex.join([*launcher, str(WORKLOAD)])
    if script:
        sh = tmp / "launch.sh"
        sh.write_text(f'#!/bin/bash\necho "launching"\n{line}\necho "torchrun finished with $?"\n')
        wrapped = ["bash", str(sh)]
    else:
        wrapped = ["bash", "-c", f"exec {line}" if exec_ else f"cd . && {line}"]
    cmd = rankwatch("run", "--config", str(cfg), "--findings-jsonl", str(found), "--", *wrapped)
    agent = _popen(cmd, job_env(tag, env), tmp / "agent.out")
    return Running(
        tag, [agent], agent.poll, lambda: _term([agent]), [found],
        lambda: sorted((tmp / "logs").glob("*.log")), [tmp / "agent.out"],
    )  # fmt: skip


def watch_launcher(
    tmp: Path,
    cfg: Path,
    launcher: list[str],
    env: dict[str, str],
    *,
    verbose: bool = False,
    match: bool = False,
) -> Running:
    """``torchrun ... > job.log 2>&1 &`` started by hand, then ``rankwatch watch --pid $!``: the
    agent follows the launcher's pid (the one a user has), its workers found under it and the
    combined log read from the launcher's stdout file. The agent ends with the launcher; the
    user sees torchrun's status. ``verbose``: the agent logs what it attaches (``-v``).
    ``match``: the sidecar of a pod whose command is that torchrun, ``watch --match
    'ddp_train[.]py' --log job.log`` (the pattern matches torchrun too), started once the job
    runs and stopped (SIGTERM, as Kubernetes stops a native sidecar) once it ended."""
    tag = uuid.uuid4().hex
    found = tmp / "f.jsonl"
    job = _popen([*launcher, str(WORKLOAD)], job_env(tag, env), tmp / "job.log", session=True)
    more = ["-v"] if verbose else []
    target = (
        ["--match", r"ddp_train[.]py", "--log", str(tmp / "job.log")] if match else ["--pid", str(job.pid)]
    )
    if match:  # the pod's workers run before the sidecar looks
        wait_for(lambda: b"step=1 " in (tmp / "job.log").read_bytes(), 120, "the pod's first step", 0.25)
    cmd = rankwatch(*more, "watch", "--config", str(cfg), "--findings-jsonl", str(found), *target)
    agent = _popen(cmd, job_env(tag, {}), tmp / "agent.out")
    return Running(
        tag, [job], job.poll, lambda: _term_groups([job]), [found],
        lambda: [tmp / "job.log"], [tmp / "job.log", tmp / "agent.out"], [agent],
        stop_agents=(lambda: _term([agent])) if match else None,
    )  # fmt: skip


def agent_under_torchrun(tmp: Path, cfg: Path, world: int, env: dict[str, str], *extra: str) -> Running:
    """``torchrun --no-python rankwatch run -- python ddp_train.py``: torchrun starts one agent
    per worker, each launching its rank with the identity torchrun gave it (``extra``: more of
    torchrun's options, ``--max-restarts``)."""
    tag = uuid.uuid4().hex
    found = tmp / "f.jsonl"
    exe = shutil.which("rankwatch", path=str(Path(sys.executable).parent)) or "rankwatch"
    cmd = torchrun(world, *extra, "--no-python", exe, "run", "--config", str(cfg))
    cmd += ["--findings-jsonl", str(found)]
    cmd += ["--", sys.executable, str(WORKLOAD)]
    launcher = _popen(cmd, job_env(tag, env), tmp / "torchrun.out")
    return Running(
        tag, [launcher], launcher.poll, lambda: _term([launcher]), [found],
        lambda: sorted((tmp / "logs").glob("*.log")), [tmp / "torchrun.out"],
    )  # fmt: skip


def _ranks_by_hand(
    tmp: Path, tag: str, world: int, env: dict[str, str], args: Sequence[str] = (), *, slurm: bool = False
) -> list[subprocess.Popen[bytes]]:
    """The ranks started as a user's own script starts them (`python train.py > rank-N.log`),
    or as srun starts its tasks (``slurm``: each with its SLURM_PROCID)."""
    port = str(free_port())
    (tmp / "logs").mkdir(exist_ok=True)
    ranks = []
    for r in range(world):
        renv = job_env(tag, {**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world)})
        renv.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        if slurm:
            renv.update(SLURM_PROCID=str(r), SLURM_LOCALID=str(r))
        cmd = [sys.executable, str(WORKLOAD), *args]
        ranks.append(_popen(cmd, renv, tmp / "logs" / f"rank-{r}.log", session=True))
    return ranks


def _exit_status(ranks: Sequence[subprocess.Popen[bytes]]) -> Callable[[], int | None]:
    """The job's status as a script waiting on its ranks sees it: the first non-zero one."""

    def status() -> int | None:
        codes = [p.poll() for p in ranks]
        return next((c for c in codes if c), 0) if all(c is not None for c in codes) else None

    return status


def watch_pids(tmp: Path, cfg: Path, world: int, env: dict[str, str]) -> Running:
    """Ranks already running, each writing its stdout to a file; ``rankwatch watch --pid P0
    --pid P1`` attaches to them (their identity from their own environment)."""
    tag = uuid.uuid4().hex
    ranks = _ranks_by_hand(tmp, tag, world, env)
    found = tmp / "f.jsonl"
    cmd = rankwatch("watch", "--config", str(cfg), "--findings-jsonl", str(found))
    for p in ranks:
        cmd += ["--pid", str(p.pid)]
    agent = _popen(cmd, job_env(tag, {}), tmp / "agent.out")
    return Running(
        tag, ranks, _exit_status(ranks), lambda: _term_groups(ranks), [found],
        lambda: sorted((tmp / "logs").glob("*.log")), [tmp / "agent.out"], [agent],
    )  # fmt: skip


@contextlib.contextmanager
def systemd_notify(
    timeout: float = 120.0,
) -> Iterator[tuple[dict[str, str], Callable[[subprocess.Popen[bytes], Path], None]]]:
    """What systemd does for a ``Type=notify`` unit (systemd/rankwatch.service): a datagram
    socket named in ``NOTIFY_SOCKET``, and ``systemctl start`` returning once the service has
    sent ``READY=1``. Yields the environment to start the service with and ``ready(proc, out)``,
    which waits (bounded) for that message; a service that ends or never says it fails the
    test (and one still running is killed)."""
    folder = Path(tempfile.mkdtemp(prefix="rw-notify-"))  # a short path: sun_path holds 108 bytes
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.bind(str(folder / "notify"))
        sock.settimeout(0.2)
        said: list[bytes] = []

        def ready(proc: subprocess.Popen[bytes], out: Path) -> None:
            def heard() -> bool:
                with contextlib.suppress(TimeoutError):
                    said.append(sock.recv(4096))
                assert proc.poll() is None, f"the service ended: {out.read_text(errors='replace')[-2000:]}"
                return any(b"READY=1" in m.split(b"\n") for m in said)

            try:
                wait_for(heard, timeout, "the service's READY=1", 0.0)
            except BaseException:
                proc.kill()
                proc.wait(timeout=10)
                raise

        yield {"NOTIFY_SOCKET": str(folder / "notify")}, ready
    finally:
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)


def node_daemon(tmp: Path, cfg: Path, world: int, env: dict[str, str]) -> Running:
    """The node daemon (systemd/rankwatch.service): one ``rankwatch watch --match`` already
    running on the node (started as systemd starts it: the job waits for its ``READY=1``), no
    ``--log``; the job's ranks start after it, as ``srun
    --output=rank-%t.log python train.py`` starts them (Slurm's variables, stdout a file), and
    the daemon follows each rank's own stdout with the identity read from its environment. The
    match is the job's own argument, so the daemon sees this cell's ranks only; it is stopped
    (``systemctl stop``) once the job has ended."""
    tag = uuid.uuid4().hex
    found = tmp / "f.jsonl"
    cmd = rankwatch("watch", "--config", str(cfg), f"--match=--rw-job={tag}", "--findings-jsonl", str(found))
    with systemd_notify() as (notify_env, ready):
        agent = _popen(cmd, job_env(tag, notify_env), tmp / "agent.out")
        ready(agent, tmp / "agent.out")
    slurm = {"SLURM_JOB_ID": "4243", "SLURM_NTASKS": str(world), **env}
    ranks = _ranks_by_hand(tmp, tag, world, slurm, [f"--rw-job={tag}"], slurm=True)

    def stop_agent() -> None:
        _term([agent])

    running = Running(
        tag, ranks, _exit_status(ranks), lambda: _term_groups(ranks), [found],
        lambda: sorted((tmp / "logs").glob("*.log")), [tmp / "agent.out"], [agent],
    )  # fmt: skip
    running.stop_agents = stop_agent
    return running


def two_nodes(tmp: Path, cfg: Path, per_node: int, env: dict[str, str]) -> Running:
    """A two-node torchrun job on one host, as each node starts it: ``rankwatch run -- torchrun
    --nnodes 2 --node-rank N --rdzv-backend c10d --rdzv-endpoint H:P --rdzv-id J`` per node, one
    agent each, the dumps folder shared (the run folder of a cluster's shared filesystem)."""
    tag = uuid.uuid4().hex
    port, job = str(free_port()), f"job-{tag[:8]}"
    agents = []
    for n in range(2):
        launcher = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(n),
            "--nproc-per-node", str(per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job, "--tee", "3",
        ]  # fmt: skip
        cmd = rankwatch("run", "--config", str(cfg), "--findings-jsonl", str(tmp / f"f{n}.jsonl"))
        out = tmp / f"agent-{n}.out"
        agents.append(_popen([*cmd, "--", *launcher, str(WORKLOAD)], job_env(tag, env), out))
    return Running(
        tag, agents, _exit_status(agents), lambda: _term(agents), [tmp / f"f{n}.jsonl" for n in range(2)],
        lambda: sorted(tmp.rglob("*.log")), [tmp / f"agent-{n}.out" for n in range(2)],
    )  # fmt: skip


def one_agent_per_rank(tmp: Path, cfg: Path, world: int, env: dict[str, str]) -> Running:
    """The srun form: one ``rankwatch run -- python train.py`` per rank, identity from Slurm's
    variables (``srun -n 2 rankwatch run -- python train.py``; the script takes its RANK from
    ``SLURM_PROCID`` as sbatch scripts do)."""
    tag = uuid.uuid4().hex
    port = str(free_port())
    agents = []
    for r in range(world):
        renv = job_env(tag, env)
        renv.update(SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NTASKS=str(world), SLURM_JOB_ID="4242")
        renv.update(RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = rankwatch("run", "--config", str(cfg), "--findings-jsonl", str(tmp / f"f{r}.jsonl"))
        agents.append(_popen([*cmd, "--", sys.executable, str(WORKLOAD)], renv, tmp / f"agent-{r}.out"))
    return Running(
        tag, agents, _exit_status(agents), lambda: _term(agents), [tmp / f"f{r}.jsonl" for r in range(world)],
        lambda: sorted((tmp / "logs").glob("*.log")), [tmp / f"agent-{r}.out" for r in range(world)],
    )  # fmt: skip


def sidecars(tmp: Path, cfg: Path, world: int, env: dict[str, str]) -> Running:
    """One "pod" per rank, as the Helm chart makes it: a PID namespace of its own (the pause
    process, ``shareProcessNamespace``), the trainer writing ``/logs/rank-$RANK.log`` through
    ``tee``, and the sidecar ``rankwatch watch --match <python> --log /logs/rank-$RANK.log``
    started separately in the same namespace with RANK, LOCAL_RANK=0, WORLD_SIZE and NODE_NAME
    in its environment (``rankwatch.sidecar`` in helm/rankwatch/templates/_helpers.tpl)."""
    tag = uuid.uuid4().hex
    port = str(free_port())
    logs = tmp / "logs"
    logs.mkdir(exist_ok=True)
    pauses: list[subprocess.Popen[bytes]] = []
    trainers: list[subprocess.Popen[bytes]] = []
    agents: list[subprocess.Popen[bytes]] = []
    for r in range(world):
        penv = job_env(tag, {})
        pause = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sleep", "infinity"],
            env=penv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        pauses.append(pause)
        ns = wait_for(lambda p=pause: psutil.Process(p.pid).children(), 10, "the pod's pause process")[0].pid
        enter = ["nsenter", "--target", str(ns), "--pid", "--mount", "--"]
        tenv = job_env(tag, {**env, "RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": str(world)})
        tenv.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOGS=str(logs))
        script = SIDECAR_TRAINER.format(python=sys.executable, workload=WORKLOAD)
        trainers.append(_popen([*enter, "bash", "-c", script], tenv, tmp / f"trainer-{r}.out"))
        aenv = job_env(tag, {"RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "NODE_NAME": "n1"})
        cmd = rankwatch("watch", "--config", str(cfg), "--match", SIDECAR_MATCH)
        cmd += ["--log", str(logs / f"rank-{r}.log"), "--findings-jsonl", str(tmp / f"f{r}.jsonl")]
        agents.append(_popen([*enter, *cmd], aenv, tmp / f"agent-{r}.out"))

    def stop_agents() -> None:
        # nsenter does not pass signals on: the agent inside is the one to stop.
        for a in agents:
            with contextlib.suppress(psutil.Error):
                for k in psutil.Process(a.pid).children():
                    k.send_signal(signal.SIGTERM)

    def stop_trainers() -> None:
        for t in trainers:
            with contextlib.suppress(psutil.Error):
                for k in psutil.Process(t.pid).children():
                    k.send_signal(signal.SIGTERM)

    def end_pods() -> None:
        for p in pauses:
            p.kill()
            p.wait(timeout=10)

    running = Running(
        tag, trainers, _exit_status(trainers), stop_trainers, [tmp / f"f{r}.jsonl" for r in range(world)],
        lambda: sorted(logs.glob("*.log")), [tmp / f"agent-{r}.out" for r in range(world)], agents,
    )  # fmt: skip
    running.stop_agents = stop_agents
    running.cleanup = [end_pods]
    return running


def torchrun_outside(
    tmp: Path, cfg: Path, world: int, env: dict[str, str], *, by: str, extra: Sequence[str] = ()
) -> Running:
    """A job the user started with ``torchrun --redirects 3 --log-dir D`` outside rankwatch:
    each worker's stdout and stderr are files of their own (``D/<run>/attempt_0/<local
    rank>/stdout.log`` and ``stderr.log``; a traceback and gloo's errors are in the second).
    ``by``: ``daemon``, the node daemon (``watch --match``, no ``--log``, already running,
    started as systemd starts it); ``pid``, ``watch --pid W0 --pid W1`` attached to the workers
    once they are there (the sidecar of a job started elsewhere). The user sees torchrun's exit
    status; the agent is stopped once the job has ended (``--pid``: it ends with the pids).
    ``shared``: the node daemon on ``torchrun ... > job.log 2>&1`` (no ``--redirects``, no
    ``--tee``): every worker and the launcher write the one file. ``extra``: more of torchrun's
    options (``--max-restarts``)."""
    tag = uuid.uuid4().hex
    found = tmp / "f.jsonl"
    logs = tmp / "torchrun-logs"
    redirects = ["--redirects", "3", "--log-dir", str(logs)] if by != "shared" else []
    launcher = [*torchrun(world, *redirects, *extra), str(WORKLOAD), f"--rw-job={tag}"]
    agents: list[subprocess.Popen[bytes]] = []
    if by in ("daemon", "shared"):
        cmd = rankwatch(
            "watch", "--config", str(cfg), f"--match=--rw-job={tag}", "--findings-jsonl", str(found)
        )
        with systemd_notify() as (notify_env, ready):
            agents.append(_popen(cmd, job_env(tag, notify_env), tmp / "agent.out"))
            ready(agents[0], tmp / "agent.out")
    job = _popen(launcher, job_env(tag, env), tmp / "torchrun.out", session=True)

    def workers() -> list[int]:
        out = []
        with contextlib.suppress(psutil.Error):
            for k in psutil.Process(job.pid).children():  # the ranks, not their DataLoader workers
                with contextlib.suppress(psutil.Error):
                    if "RANK" in k.environ():
                        out.append(k.pid)
        return sorted(out)

    if by == "pid":
        pids = wait_for(lambda: len(workers()) == world and workers(), 60, "torchrun's workers", 0.05)
        cmd = rankwatch("watch", "--config", str(cfg), "--findings-jsonl", str(found))
        for p in pids:
            cmd += ["--pid", str(p)]
        agents.append(_popen(cmd, job_env(tag, {}), tmp / "agent.out"))
    running = Running(
        tag, [job], job.poll, lambda: _term_groups([job]), [found],
        lambda: sorted(logs.rglob("*.log")) or [tmp / "torchrun.out"],
        [tmp / "torchrun.out", tmp / "agent.out"], agents,
    )  # fmt: skip
    if by in ("daemon", "shared"):
        running.stop_agents = lambda: _term(agents)
    return running
