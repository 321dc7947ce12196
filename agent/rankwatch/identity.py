"""Who a watched process is: run, rank, local rank, world size, node, user.

Identity belongs to the watched process: a node daemon watching two users' jobs reads each
one's from that process's own environment (``identity_of_process``); the agent's own is only
the default for what it launched. Launchers each export their own variables (Slurm,
torchrun/elastic, accelerate and the DeepSpeed launcher through torchrun's names, Open MPI,
PMI); Kubernetes names the pod in the process's cgroup. Config wins over all of them so a
user can always say what the environment cannot. These are the only lists of the variables.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from rankwatch.config.schema import RunConfig

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
RUN_VARS = ("RANKWATCH_RUN", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "LSB_JOBID", "PBS_JOBID")
# Kubernetes: .../kubepods[-burstable|-besteffort]/pod<uid>/<container> (cgroup v1 and v2, with
# "_" for "-" under the systemd driver).
_POD_RE = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


# A rank in a log file's name (one file per rank, written by a launcher or a user's shell).
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])(?:rank|proc|worker|task|process)[-_.]?(\d+)", re.IGNORECASE)


def rank_from_path(path: str | os.PathLike[str]) -> int | None:
    """``rank-3.log``, ``rank3.out``, ``worker_3.txt``, ``job.task-3.log`` -> 3."""
    m = _RANK_IN_NAME.search(Path(path).name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Identity:
    run: str
    rank: int | None
    local_rank: int | None
    world_size: int | None
    node: str
    job_end: float | None = None  # unix time the allocation ends (Slurm time limit)
    user: str | None = None  # whose process it is (a node daemon watches many users' jobs)

    def labels(self) -> dict[str, str]:
        return {
            "run": self.run,
            "rank": "" if self.rank is None else str(self.rank),
            "local_rank": "" if self.local_rank is None else str(self.local_rank),
            "node": self.node,
        }


def _int(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for n in names:
        v = env.get(n, "").strip()
        if v.isdigit():
            return int(v)
    return None


def _float(env: Mapping[str, str], names: tuple[str, ...]) -> float | None:
    for n in names:
        try:
            v = float(env.get(n, "").strip())
        except ValueError:
            continue
        if v > 0:
            return v
    return None


def identity_from_env(cfg: RunConfig, env: Mapping[str, str] | None = None) -> Identity:
    env = os.environ if env is None else env
    run = cfg.name
    if run is None:
        run = next((env[n] for n in RUN_VARS if env.get(n, "").strip()), "default")
        if run == "none":  # torchrun's default rdzv id
            run = "default"
    return Identity(
        run=run,
        rank=cfg.rank if cfg.rank is not None else _int(env, RANK_VARS),
        local_rank=cfg.local_rank if cfg.local_rank is not None else _int(env, LOCAL_RANK_VARS),
        world_size=cfg.world_size if cfg.world_size is not None else _int(env, WORLD_VARS),
        node=cfg.node or env.get("SLURMD_NODENAME") or socket.gethostname(),
        job_end=cfg.job_end if cfg.job_end is not None else _float(env, ("SLURM_JOB_END_TIME",)),
    )


_RDZV_ID_FLAGS = ("--rdzv-id", "--rdzv_id")


def launcher_run_id(cmd: list[str], env: Mapping[str, str] | None = None) -> str | None:
    """The run id torchrun gives its workers (``TORCHELASTIC_RUN_ID``), read from its command
    line before it starts them: ``--rdzv-id X`` / ``--rdzv_id=X``, else ``PET_RDZV_ID`` (torch's
    ``argparse_util.env``). The agents of a job's nodes then share one run (its alert board, its
    run folder) from their start. None for another command, torchrun's default ``none``, or
    ``--standalone`` (a random id, known only once the workers run)."""
    env = os.environ if env is None else env
    names = [os.path.basename(a) for a in cmd[:3]]
    torchrun = "torchrun" in names or any(
        a == "-m" and b in ("torch.distributed.run", "torch.distributed.launch")
        for a, b in itertools.pairwise(cmd)
    )
    if not torchrun or "--standalone" in cmd:
        return None
    found: str | None = None
    for i, a in enumerate(cmd):
        if a.endswith(".py") and i > 0 and cmd[i - 1] not in _RDZV_ID_FLAGS:
            break  # the training script: what follows is its own arguments
        flag, eq, value = a.partition("=")
        if flag in _RDZV_ID_FLAGS:
            found = value if eq else (cmd[i + 1] if i + 1 < len(cmd) else None)
    if found is None:
        found = env.get("PET_RDZV_ID")
    found = (found or "").strip()
    return found if found and found != "none" else None


def pod_of(cgroup: str | None) -> str | None:
    """The Kubernetes pod UID in a ``/proc/<pid>/cgroup`` text, dashed."""
    m = _POD_RE.search(cgroup or "")
    return m.group(1).replace("_", "-") if m else None


def identity_of_process(
    cfg: RunConfig,
    env: Mapping[str, str],
    default: Identity,
    *,
    user: str | None = None,
    cgroup: str | None = None,
) -> Identity:
    """A watched process's identity from its own environment; what it does not say comes from
    ``default`` (the agent's). Without a job id of its own, a Kubernetes pod names its run."""
    # The process's own variables first: the agent's config (its run.rank) is the agent's.
    own = identity_from_env(RunConfig(name=cfg.name), env)
    run = own.run
    if run == "default" and cfg.name is None:
        pod = pod_of(cgroup)
        run = f"pod-{pod}" if pod is not None else default.run
    return replace(
        default,
        run=run,
        rank=own.rank if own.rank is not None else default.rank,
        local_rank=own.local_rank if own.local_rank is not None else default.local_rank,
        world_size=own.world_size if own.world_size is not None else default.world_size,
        node=env.get("SLURMD_NODENAME") or default.node,
        job_end=own.job_end if own.job_end is not None else default.job_end,
        user=user if user is not None else default.user,
    )
