"""The watched GPUs through NVML, every ``gpu.interval``, each rank's GPUs to that rank's engine.

``open`` initialises NVML off the loop (a node without it logs one line and is never
sampled). Each sample first ties GPUs to the watched ranks when their processes changed (or
every ``REMAP_S``): NVML's compute-process lists, then each rank's ``CUDA_VISIBLE_DEVICES``
and local rank (``gpu.sampler.attribute_pids_to_gpus``); then reads every watched GPU. The
GPUs of one rank go to that rank as one ``GpuRound``; those tied to no watched rank go to an
engine of their own. A sample stuck in a driver call is news itself: each period it stays
stuck, ``overdue`` hands on an ``NvmlHang`` with how long NVML has not answered (the
``gpu_unresponsive`` rule), and the metrics read ``up`` 0 with no stale readings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rankwatch import offloop
from rankwatch.events import Event, GpuRound, GpuSample, NvmlHang
from rankwatch.gpu.sampler import GpuSampler
from rankwatch.sources.polled import Sampled, SourceContext, ToRank, WatchedRank, register_source

REMAP_S = 30.0  # the ranks' GPUs are tied again this often, and whenever their processes change
# How long one sample waits for the environment of the watched processes (read once per PID
# from /proc, where a process in D state blocks the read); past it the mapping goes on
# without it, and the read is tried again at the next mapping.
ENV_WAIT_S = 1.0


def _environ(pid: int) -> dict[str, str]:
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except Exception:
        return {}


def environ_within(pid: int, wait: float) -> dict[str, str] | None:
    """``pid``'s environment read on a daemon thread; None when it did not come within ``wait``."""
    got: list[dict[str, str]] = []
    done = threading.Event()

    def work() -> None:
        got.append(_environ(pid))

    offloop.start(work, f"rankwatch-proc-env-pid{pid}", then=done.set)
    return got[0] if done.wait(wait) and got else None


@register_source
class GpuSource:
    name: ClassVar[str] = "gpu"
    face: ClassVar[str] = "gpu_latest"

    def __init__(self, ctx: SourceContext, sampler: GpuSampler) -> None:
        self.ctx = ctx
        self.sampler = sampler
        self.owner: dict[int, int | None] = {}  # GPU index -> the rank its processes are
        self.single = True  # the agent watches at most one rank
        self._known: frozenset[int] | None = None
        self._next_map = 0.0
        self._env: dict[int, dict[str, str]] = {}  # by PID: a process's environment never changes

    @classmethod
    def create(cls, ctx: SourceContext) -> GpuSource | None:
        if not ctx.cfg.gpu.enabled:
            return None
        return cls(ctx, GpuSampler(ctx.cfg.gpu, backend=ctx.backends.get(cls.name)))

    @property
    def interval(self) -> float:
        return float(self.ctx.cfg.gpu.interval)

    @property
    def timeout(self) -> float:
        return float(self.ctx.cfg.gpu.call_timeout) + ENV_WAIT_S

    @property
    def failed(self) -> int:
        """NVML readings that failed (the sampler logs each kind once)."""
        return self.sampler.errors

    def open(self) -> bool:
        return self.sampler.open()

    def close(self) -> None:
        self.sampler.shutdown()

    def inputs(self) -> Sequence[WatchedRank]:
        return tuple(self.ctx.ranks())

    def sample(self, inputs: Sequence[WatchedRank]) -> list[Sampled]:
        self.single = len(inputs) <= 1
        known = frozenset(p for r in inputs for p in r.known)
        now = time.monotonic()
        if (known != self._known or now >= self._next_map) and any(r.pids for r in inputs):
            # No process yet (a trainer still starting): every GPU, no warning that none is tied.
            self._known, self._next_map = known, now + REMAP_S
            self.owner = self.sampler.map(self._trees(inputs))
        by_rank: dict[int | None, list[GpuSample]] = {}
        for s in self.sampler.sample():
            by_rank.setdefault(self.rank_of(s), []).append(s)
        now = time.monotonic()
        out: list[Sampled] = [ToRank(rank, GpuRound(now, tuple(mine))) for rank, mine in by_rank.items()]
        out.append(NvmlHang(now, None))
        return out

    def _trees(self, ranks: Sequence[WatchedRank]) -> list[tuple[int | None, list[int], dict[str, str]]]:
        deadline = time.monotonic() + ENV_WAIT_S
        trees: list[tuple[int | None, list[int], dict[str, str]]] = []
        for r in ranks:
            if not r.pids:
                continue
            root = r.pids[0]
            env = self._env.get(root)
            if env is None:
                env = environ_within(root, max(0.0, deadline - time.monotonic()))
                if env is not None:
                    self._env[root] = env
            trees.append((r.rank, list(r.pids), {**(env or {}), **r.env}))
        live = {r.pids[0] for r in ranks if r.pids}
        for pid in [p for p in self._env if p not in live]:
            del self._env[pid]
        return trees

    def overdue(self, seconds: float) -> list[Event]:
        self.sampler.hung(seconds)
        return [NvmlHang(time.monotonic(), self.sampler.hung_for())]

    def rank_of(self, sample: GpuSample) -> int | None:
        if sample.index in self.owner:
            return self.owner[sample.index]
        return self.ctx.rank if self.single else None

    def view(self) -> tuple[Mapping[Any, list[GpuSample]], bool]:
        """The latest samples by rank ("" for GPUs tied to none) and whether NVML is up."""
        out: dict[Any, list[GpuSample]] = {}
        for s in self.sampler.latest():
            rank = self.rank_of(s)
            out.setdefault(rank if rank is not None else "", []).append(s)
        return out, self.sampler.up
