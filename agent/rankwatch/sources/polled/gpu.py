"""The watched GPUs through NVML, every ``gpu.interval``, each rank's GPUs to that rank's engine.

``open`` initialises NVML off the loop (a node without it logs one line and is never
sampled). Each sample first ties GPUs to the watched ranks when their processes changed (or
every ``REMAP_S``): NVML's compute-process lists, then each rank's ``CUDA_VISIBLE_DEVICES``
and local rank (``gpu.sampler.attribute_pids_to_gpus``), from the environment of the rank's
process, read once per PID on a thread of its own; then reads every watched GPU. The
GPUs of one rank go to that rank as one ``GpuRound``; those tied to no watched rank go to an
engine of their own. A sample stuck in a driver call is news itself: each period it stays
stuck, ``overdue`` hands on an ``NvmlHang`` with how long NVML has not answered (the
``gpu_unresponsive`` rule), and the metrics read ``up`` 0 with no stale readings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from rankwatch import offloop
from rankwatch.events import Event, GpuRound, GpuSample, NvmlHang
from rankwatch.gpu.sampler import GpuSampler
from rankwatch.sources.polled import Sampled, SourceContext, ToRank, WatchedRank, register_source

log = logging.getLogger("rankwatch.gpu")

REMAP_S = 30.0  # the ranks' GPUs are tied again this often, and whenever their processes change


def _environ(pid: int) -> dict[str, str]:
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except Exception:
        return {}


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
        # A watched process's environment (CUDA_VISIBLE_DEVICES, LOCAL_RANK), by PID: read once
        # (it never changes) on a thread of its own, started from ``inputs``, so a process in D
        # state, whose /proc environ read blocks, never holds a sample; ``_pending``: since when.
        self._env: dict[int, dict[str, str]] = {}
        self._pending: dict[int, float] = {}
        self._lock = threading.Condition()
        self.env_given_up = 0

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
        return float(self.ctx.cfg.gpu.call_timeout)

    @property
    def failed(self) -> int:
        """NVML readings that failed (the sampler logs each kind once), and environments given up on."""
        return self.sampler.errors + self.env_given_up

    def open(self) -> bool:
        return self.sampler.open()

    def close(self) -> None:
        self.sampler.shutdown()

    def inputs(self) -> Sequence[WatchedRank]:
        ranks = tuple(self.ctx.ranks())
        for r in ranks:
            if r.pids:
                self._read_env(r.pids[0])
        return ranks

    def _read_env(self, pid: int) -> None:
        with self._lock:
            if pid in self._env or pid in self._pending:
                return
            self._pending[pid] = time.monotonic()

        def work() -> None:
            env = _environ(pid)
            with self._lock:
                self._env[pid] = env
                self._pending.pop(pid, None)
                self._lock.notify_all()

        offloop.start(work, f"rankwatch-proc-env-pid{pid}")

    def sample(self, inputs: Sequence[WatchedRank]) -> list[Sampled]:
        self.single = len(inputs) <= 1
        known = frozenset(p for r in inputs for p in r.known)
        now = time.monotonic()
        if (known != self._known or now >= self._next_map) and any(r.pids for r in inputs):
            # No process yet (a trainer still starting): every GPU, no warning that none is tied.
            trees = self._trees(inputs, now)
            if trees is not None:  # else an environment is still being read: tied next sample
                self._known, self._next_map = known, now + REMAP_S
                self.owner = self.sampler.map(trees)
        by_rank: dict[int | None, list[GpuSample]] = {}
        for s in self.sampler.sample():
            by_rank.setdefault(self.rank_of(s), []).append(s)
        now = time.monotonic()
        out: list[Sampled] = [ToRank(rank, GpuRound(now, tuple(mine))) for rank, mine in by_rank.items()]
        out.append(NvmlHang(now, None))
        return out

    def _trees(
        self, ranks: Sequence[WatchedRank], now: float
    ) -> list[tuple[int | None, list[int], dict[str, str]]] | None:
        """Each rank's (rank, PIDs, environment); None while an environment is being read."""
        trees: list[tuple[int | None, list[int], dict[str, str]]] = []
        roots = {r.pids[0] for r in ranks if r.pids}
        current = [r.current() for r in ranks]  # a walk of /proc each: before the lock
        with self._lock:
            # A read takes milliseconds: waited for briefly, so a new rank is tied at its first sample.
            self._lock.wait_for(lambda: not roots & self._pending.keys(), self.timeout / 2)
            for r, pids in zip(ranks, current, strict=True):
                if not r.pids:
                    continue
                root = r.pids[0]
                env = self._env.get(root)
                if env is None:
                    since = self._pending.get(root)
                    if since is not None and now - since < offloop.PROC_TIMEOUT_S:
                        return None
                    self._env[root] = env = {}  # stuck (D state?): tied without it, not read again
                    self.env_given_up += 1
                    if self.env_given_up == 1:
                        log.warning(
                            "environment of pid %d not read within %gs (%s); its GPUs are tied without it",
                            root,
                            offloop.PROC_TIMEOUT_S,
                            offloop.PROC_HINT,
                        )
                trees.append((r.rank, list(pids), {**env, **r.env}))
            for pid in [p for p in self._env if p not in roots]:
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
