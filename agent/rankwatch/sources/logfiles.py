"""Whose log a file is, from where it lies: the one rule for ``analyze`` and ``watch --log``.

A launcher or a user's shell names a rank's file (``rank-3.log``, ``worker_3.txt``), and
torchrun's ``--redirects``/``--tee`` with ``--log-dir D`` lays out a folder per worker process,
``D/<run id>_<random>/attempt_<n>/<local rank>/{stdout,stderr}.log`` (``torch.distributed.
elastic.multiprocessing.api.DefaultLogsSpecs.reify``): its two files are one process's, and the
folder's number is the worker's local rank. That equals its global rank on node rank 0 (every
single-node job); on the other nodes of a multi-node job only the log itself can tell, so the
``[rank5]:`` prefixes in a worker's lines win over the folder (``analyze`` reads them first).
Files that say nothing of a rank are numbered by their position among the files given.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rankwatch.config.schema import RunConfig
from rankwatch.identity import Identity, rank_from_path
from rankwatch.sources.compressed import SUFFIXES

__all__ = ["LogPlace", "log_identity", "log_place", "places_of"]

log = logging.getLogger("rankwatch.logs")

_ATTEMPT = re.compile(r"attempt_\d+")
_WORKER_FILES = ("stdout.log", "stderr.log")


@dataclass(frozen=True)
class LogPlace:
    """What a file's place says of the process that wrote it."""

    rank: int | None  # the rank taken when the lines name none
    local_rank: int | None  # torchrun's worker folder number
    worker: str | None  # that folder: every file under it is one process's
    named: bool  # ``rank`` is in the file's own name (else its folder's or its position)


def _torchrun_worker(path: Path) -> tuple[int, str] | None:
    """(local rank, folder) for a file of torchrun's per-worker log folder."""
    name = path.name
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)  # a copy compressed after the run is still the worker's
    parts = path.parts
    if name not in _WORKER_FILES or len(parts) < 3:
        return None
    local, attempt = parts[-2], parts[-3]
    if not (local.isascii() and local.isdigit() and _ATTEMPT.fullmatch(attempt)):
        return None
    return int(local), os.path.normpath(str(path.parent))


def log_place(path: str | os.PathLike[str], position: int | None = None) -> LogPlace:
    """The place of one file; ``position``: its index among the files given (None: alone)."""
    p = Path(path)
    named = rank_from_path(p)
    if named is not None:
        return LogPlace(named, None, None, True)
    worker = _torchrun_worker(p)
    if worker is not None:
        return LogPlace(worker[0], worker[0], worker[1], False)
    return LogPlace(position, None, None, False)


def places_of(paths: Sequence[str | os.PathLike[str]]) -> list[LogPlace]:
    """The place of each of several files, each numbered by position where nothing else says."""
    return [log_place(p, i) for i, p in enumerate(paths)]


def log_identity(identity: Identity, run: RunConfig, logs: Sequence[str | os.PathLike[str]]) -> Identity:
    """The identity of the one rank ``watch --log PATH`` follows through a single file.

    The file's place names its rank as it does for several files and for ``analyze``
    (``rank-1.log``, a torchrun worker folder); only ``run.rank`` in the config (or ``--set``)
    wins over it, being the user's own word for this agent. The agent's environment (``RANK``,
    ``SLURM_PROCID``) says less: an ``srun --overlap`` step beside the job has a task id of its
    own. A file whose place names no rank leaves ``identity`` as it is (the environment's rank,
    or none)."""
    if len(logs) != 1 or run.rank is not None:
        return identity
    path = logs[0]
    place = log_place(path)
    if place.rank is None:
        return identity
    if identity.rank is not None and identity.rank != place.rank:
        log.warning(
            "%s is rank %d by its name, the agent's environment says rank %d: watching it as "
            "rank %d (set run.rank to say otherwise)",
            path, place.rank, identity.rank, place.rank,
        )  # fmt: skip
    local = place.local_rank if place.local_rank is not None else identity.local_rank
    return replace(identity, rank=place.rank, local_rank=local)
