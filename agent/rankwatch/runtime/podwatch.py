"""`rankwatch watch --k8s`: a node DaemonSet watching the opted-in pods' ranks.

Every scan (``kubernetes.interval``, off the loop) lists the node's opted-in rank processes
(``rankwatch.k8s.node``); each (pod, container, rank) gets a pipeline of its own, with the
run and rank of its process and the pod's container log (CRI format, joined back into the
trainer's lines). A restarted rank (same pod, container and rank, new pid) goes on in the
same pipeline; the pod's namespace, name, container and GPUs are exported as
``rankwatch_pod_info`` / ``rankwatch_pod_gpu_info``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

from rankwatch import offloop
from rankwatch.config.schema import Config
from rankwatch.identity import Identity
from rankwatch.k8s.crilog import Joiner
from rankwatch.k8s.node import RankProcess, Scanner
from rankwatch.k8s.podresources import visible_devices
from rankwatch.runtime import lifecycle
from rankwatch.runtime.agent import Agent, Sink
from rankwatch.runtime.stdio import StderrGuard
from rankwatch.runtime.watcher import RankWatcher
from rankwatch.snapshot import PodView
from rankwatch.sources.process import ProcessProber

log = logging.getLogger("rankwatch.k8s")

Key = tuple[str, str, int | None]  # pod UID, container, rank


def _look(
    scanner: Scanner, attached: set[int], clock: Callable[[], float]
) -> list[tuple[RankProcess, ProcessProber | None]]:
    """The node's ranks, and a prober for each one not watched yet. Blocking (a process in D
    state blocks reading its command line): run it through ``offloop.proc``."""
    return [(rp, None if rp.pid in attached else ProcessProber(rp.pid, clock=clock)) for rp in scanner.scan()]


def _s(v: int | None) -> str:
    return "" if v is None else str(v)


async def watch_pods(
    cfg: Config,
    identity: Identity,
    *,
    sinks: Sequence[Sink],
    stop: asyncio.Event | None = None,
    services: dict[str, Any] | None = None,
    scanner: Scanner | None = None,
) -> int:
    guard = StderrGuard()
    guard.install()
    try:
        return await _watch_pods(cfg, identity, sinks=sinks, stop=stop, services=services, scanner=scanner)
    finally:
        guard.restore()


async def _watch_pods(
    cfg: Config,
    identity: Identity,
    *,
    sinks: Sequence[Sink],
    stop: asyncio.Event | None,
    services: dict[str, Any] | None,
    scanner: Scanner | None,
) -> int:
    stop = stop or asyncio.Event()
    scanner = scanner or Scanner(cfg.kubernetes)
    agent = Agent(cfg, identity, sinks=sinks)
    pods: dict[Key, tuple[RankWatcher, PodView]] = {}
    agent.pods = lambda: tuple(v for _, v in pods.values())
    tasks: dict[Key, asyncio.Task[Any]] = {}

    async def retire(key: Key) -> None:
        """The container was restarted by the kubelet: its output now goes to the next
        ``<n>.log``. The old pipeline has said what it saw (the exit); a new one follows the
        new file under the same labels (two watchers with one label set would be one series)."""
        w, _ = pods.pop(key)
        w.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(tasks.pop(key), 5.0)
        w.drain()
        w.flush_held()
        w.close()
        with contextlib.suppress(ValueError):
            agent.watchers.remove(w)

    async def add(rp: RankProcess, prober: ProcessProber | None) -> None:
        key = (rp.uid, rp.container, rp.rank)
        have = pods.get(key)
        if have is not None:
            w = have[0]
            if not w.exited or (w.prober is not None and w.prober.pid == rp.pid):
                return
            if w.path == (str(rp.log) if rp.log is not None else None):
                w.attach(rp.pid, prober)  # restarted in its container (torchrun): same pipeline
                return
            await retire(key)
        ident = dataclasses.replace(
            identity, run=rp.run, rank=rp.rank, local_rank=rp.local_rank, world_size=rp.world_size
        )
        w = agent.add_watcher([rp.log] if rp.log is not None else [], ident, from_end=True, replay=True)
        for s in w.streams:
            s.cri = Joiner(int(cfg.logs.max_line_bytes))
        visible = visible_devices(rp.gpus, rp.cuda_visible_devices)
        if visible is not None:
            w.gpu_env = {"CUDA_VISIBLE_DEVICES": visible}  # NVML on the host knows them by UUID
        w.attach(rp.pid, prober)
        labels = (ident.run, _s(ident.rank), _s(ident.local_rank), ident.node)
        pods[key] = (w, PodView(labels, rp.namespace, rp.pod, rp.container, rp.gpus))
        tasks[key] = asyncio.create_task(w.run())
        log.info(
            "pod %s/%s container %s: rank %s of run %s, pid %d, GPUs %s, log %s",
            rp.namespace, rp.pod, rp.container, rp.rank, rp.run, rp.pid, ",".join(rp.gpus) or "-", rp.log,
        )  # fmt: skip

    async def scan() -> None:
        attached = {w.prober.pid for w, _ in pods.values() if w.prober is not None and not w.exited}
        try:
            found = await offloop.proc(
                functools.partial(_look, scanner, attached, agent.clock),
                name="rankwatch-k8s-scan",
                errors=agent.internal_errors_by_component,
            )
        except asyncio.TimeoutError:
            return  # logged and counted by offloop; tried again next period
        for rp, prober in found:
            await add(rp, prober)

    loop = asyncio.get_running_loop()
    extras = await lifecycle.start(agent, cfg, services, stop=stop)
    next_scan = 0.0
    try:
        while not stop.is_set():
            lifecycle.judge_exits(agent, [w for w, _ in pods.values()])
            if loop.time() >= next_scan:
                await scan()
                next_scan = loop.time() + cfg.kubernetes.interval
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), min(cfg.process.sample_interval, cfg.kubernetes.interval))
    finally:
        await lifecycle.stop_watchers(agent, extras, [w for w, _ in pods.values()], list(tasks.values()))
    return 0
