"""Ports and Prometheus discovery for agents on shared Slurm nodes.

A fixed port per local rank (9478 + i) collides on a node shared by several jobs: the second
agent does not get its port, and a file_sd entry written from the job's plan then points
Prometheus at another job's agent under this job's labels. So an agent listens on
``HOST:auto`` — its step's reserved port (``SLURM_STEP_RESV_PORTS``, ``srun --resv-ports``
or ``MpiParams=ports=``) where there is one, else any free port — and writes the address it
really bound into its own file_sd file (``--sd-file``), removed when it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

AUTO = "auto"


def reserved_ports(spec: str) -> list[int]:
    """``12000-12003,12010`` -> [12000, 12001, 12002, 12003, 12010]."""
    ports: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"SLURM_STEP_RESV_PORTS={spec!r}: expected ports like 12000-12007,12010")
        ports.extend(range(int(lo), int(hi if sep else lo) + 1))
    return ports


def auto_port(env: Mapping[str, str] | None = None) -> int:
    """This task's reserved port (indexed by its local id), else 0: any free port."""
    env = os.environ if env is None else env
    spec = env.get("SLURM_STEP_RESV_PORTS", "").strip()
    if not spec:
        return 0
    ports = reserved_ports(spec)
    local = env.get("SLURM_LOCALID", "0")
    index = int(local) if local.isdigit() else 0
    return ports[index] if index < len(ports) else 0


def resolve_listen(listen: str, env: Mapping[str, str] | None = None) -> str:
    """``HOST:auto`` -> ``HOST:<port>``; anything else unchanged."""
    host, sep, port = listen.rpartition(":")
    if sep and port == AUTO:
        return f"{host}:{auto_port(env)}"
    if listen == AUTO:
        return f"0.0.0.0:{auto_port(env)}"
    return listen


def target_host(bound_host: str, node: str) -> str:
    """The address Prometheus should scrape: the node's name for a wildcard bind."""
    if bound_host in ("", "0.0.0.0", "::", "[::]"):
        return node
    return f"[{bound_host}]" if ":" in bound_host else bound_host


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def sd_labels(env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    labels = {
        "slurm_job_id": env.get("SLURM_JOB_ID", ""),
        "slurm_job_name": re.sub(r"[^A-Za-z0-9._-]", "_", env.get("SLURM_JOB_NAME", "")),
        "slurm_user": env.get("SLURM_JOB_USER") or _user(),
    }
    return {k: v for k, v in labels.items() if v}


def write_sd_file(path: str | os.PathLike[str], target: str, labels: Mapping[str, str]) -> None:
    """One Prometheus file_sd entry, written atomically (Prometheus never reads half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = [{"targets": [target], "labels": dict(labels)}]
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_sd_file(path: str | os.PathLike[str]) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# --- a plain step's launcher ---------------------------------------------------------------------

# A Slurm task's stdout and stderr are pipes to its slurmstepd, which sends them to the ``srun``
# that launched the step: what the user reads (``srun -n 2 python train.py > job.out``) is that
# srun's output, holding every task's lines and srun's own word on each task's end ("srun: error:
# n01: task 1: Aborted"). srun listens on the port each task's environment names for it
# (``SLURM_SRUN_COMM_PORT``, at ``SLURM_SRUN_COMM_HOST``).
SRUN_NAMES = frozenset({"srun"})
# srun's account of tasks' ends (src/srun/launch.c): "srun: error: <node>: task 1: Aborted",
# "srun: error: <node>: tasks 0-1: Exited with exit code 1"; the tasks it names, by id.
SRUN_TASKS_RE = re.compile(r"^srun: error: \S+: tasks? ([\d,\-]{1,200}): ")


def is_srun(cmd: list[str]) -> bool:
    return bool(cmd) and os.path.basename(cmd[0]) in SRUN_NAMES


def named_tasks(text: str) -> set[int] | None:
    """The task ids an srun line says ended (``tasks 0-2,5``), or None when it is no such line."""
    m = SRUN_TASKS_RE.match(text)
    if m is None:
        return None
    out: set[int] = set()
    for part in m.group(1).split(","):
        lo, sep, hi = part.partition("-")
        if lo.isdigit() and (not sep or hi.isdigit()):
            out.update(range(int(lo), min(int(hi if sep else lo), int(lo) + 4095) + 1))
    return out


def _local_addresses() -> set[str]:
    import psutil

    out = {"localhost"}
    with contextlib.suppress(OSError):
        for addrs in psutil.net_if_addrs().values():
            out.update(a.address.split("%")[0] for a in addrs)
    with contextlib.suppress(OSError):
        out.add(socket.gethostname())
    return out


def srun_of_task(env: Mapping[str, str], uid: int) -> int | None:
    """The pid of the srun on this node that launched a task with this environment and owner,
    or None (no such variables, srun on another node, gone, or not the task's user's: another
    user's process listening on that port is never taken for it). Blocking: reads /proc."""
    import psutil

    port, host = env.get("SLURM_SRUN_COMM_PORT", ""), env.get("SLURM_SRUN_COMM_HOST", "")
    if not port.isdigit() or not host or host not in _local_addresses():
        return None
    for proc in psutil.process_iter(["name", "uids"]):
        try:
            if proc.info["name"] not in SRUN_NAMES or proc.info["uids"] is None:
                continue
            if uid not in (proc.info["uids"].real, proc.info["uids"].effective):
                continue
            listening = {c.laddr.port for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            continue
        if int(port) in listening:
            return int(proc.pid)
    return None
