"""Who this agent watches: run name, rank, local rank, world size, node.

Launchers each export their own variables; config wins over all of them so a user can
always say what the environment cannot.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from rankwatch.config.schema import RunConfig

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
RUN_VARS = ("RANKWATCH_RUN", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID")


@dataclass(frozen=True)
class Identity:
    run: str
    rank: int | None
    local_rank: int | None
    world_size: int | None
    node: str
    job_end: float | None = None  # unix time the allocation ends (Slurm time limit)

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
