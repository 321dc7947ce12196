"""Alert delivery: one queue and one task per sink, each with its own retry policy, so a sink
that hangs never delays another nor the caller (``enqueue`` only queues).

Per sink: FIFO (a resolve never overtakes its firing), a token bucket of
``rate_limit_per_minute`` (excess waits, is not dropped), retries with exponential backoff and
"equal" jitter (``RetryPolicy``: the n-th wait is between half and all of
``min(backoff_max, 2**(n-1) s)``) at most ``max_retries`` times, a sink's Retry-After honoured
as a floor (capped at ``backoff_max``), permanent errors not retried. Half of every wait is
fixed so the budget is a guarantee, not an average: with the defaults (12 retries, 300 s) an
alert is given up no sooner than 705 s after its first failure (``retry_window``), so a sink
down for 10 minutes loses nothing; full jitter could draw twelve short waits and give up after
a minute or two. A resolve never reaches a sink that gave up its firing (the members whose
firing it dropped are left out of it). A sink may bring its own ``retry_policy``.

Spool: it is the outbox. Every alert is written to a per run+rank spool file before its first
attempt (the alert state file counts it as announced from then on: ``outbox_pending``), and
removed once its sink acknowledged it; the next start loads what is left and delivers it (with
a fresh retry budget). So an agent SIGKILLed while an attempt is in flight loses nothing: the
restarted one sends it again. Delivery is at-least-once: a crash between delivery and removal
re-sends one alert; in the normal case nothing is sent twice.

Sinks with ``refresh_interval`` (Alertmanager) get the active alerts re-posted that often,
best effort (never retried nor spooled; skipped while that sink has a backlog).

``stats[sink]``: ``sent`` deliveries, ``failed`` failed attempts, ``retried`` retries
scheduled, ``dropped`` alerts given up (retries exhausted, permanent error, spool or queue
bound). Each dropped alert is logged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rankwatch.actions.alerts.message import AlertMember, AlertMessage, AlertSink, DeliveryError
from rankwatch.actions.alerts.spool import Spool, SpoolEntry
from rankwatch.config.schema import AlertsConfig
from rankwatch.offloop import fs

log = logging.getLogger("rankwatch.alerts")

MAX_QUEUE = 10_000
BACKOFF_BASE_S = 1.0
Spooled = dict[tuple[int | None, str, str | None], tuple[AlertMessage, AlertMember]]  # (rank, kind, subject)


@dataclass(frozen=True)
class RetryPolicy:
    """How one sink retries a failed alert (see the module doc)."""

    max_retries: int = 12
    backoff_max: float = 300.0
    base: float = BACKOFF_BASE_S

    @classmethod
    def of(cls, cfg: AlertsConfig, base: float = BACKOFF_BASE_S) -> RetryPolicy:
        return cls(int(cfg.max_retries), float(cfg.backoff_max), base)

    def delay(self, attempts: int, draw: float, retry_after: float | None = None) -> float:
        """The wait after the ``attempts``-th failure; ``draw`` in [0, 1) is the jitter."""
        cap = min(self.backoff_max, self.base * 2.0 ** (attempts - 1))
        delay = cap / 2 + draw * cap / 2
        if retry_after is not None:
            # A server's wish, within our own ceiling: one absurd Retry-After must not park the
            # queue, and a short one must not burn the retry budget in seconds.
            delay = max(delay, min(max(0.0, retry_after), self.backoff_max))
        return delay

    def window(self) -> float:
        """The shortest time between an alert's first failed attempt and its being given up."""
        return sum(min(self.backoff_max, self.base * 2.0**n) / 2 for n in range(max(0, self.max_retries)))


def retry_window(cfg: AlertsConfig, backoff_base: float = BACKOFF_BASE_S) -> float:
    """The shortest time between an alert's first failed attempt and its being given up: the sum
    of the fixed halves of its ``max_retries`` waits (705 s with the defaults)."""
    return RetryPolicy.of(cfg, backoff_base).window()


@dataclass(eq=False)
class Item:
    alert: AlertMessage
    entry_id: str
    attempts: int = 0
    not_before: float = 0.0
    spooled: bool = False
    refresh: bool = False
    dropped: bool = False


class Bucket:
    """Token bucket: ``per_minute`` burst, refilled continuously; <= 0 means unlimited."""

    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.tokens = self.capacity
        self.rate = per_minute / 60.0
        self.last = now

    def wait_time(self, now: float) -> float:
        if self.capacity <= 0:
            return 0.0
        self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def take(self) -> None:
        if self.capacity > 0:
            self.tokens -= 1.0


class SinkWorker:
    def __init__(self, sink: AlertSink, bucket: Bucket, retry: RetryPolicy) -> None:
        self.sink = sink
        self.name = sink.name
        self.queue: deque[Item] = deque()
        self.bucket = bucket
        self.retry: RetryPolicy = getattr(sink, "retry_policy", None) or retry
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.refresh_interval: float | None = getattr(sink, "refresh_interval", None)
        self.next_refresh = 0.0
        # (rank, kind, subject) whose firing this sink never got: their resolve is not sent there
        self.lost: set[tuple[int | None, str, str | None]] = set()
        self.due: float | None = None  # while asleep: the clock time it waits for (inf: a wake)


class Delivery:
    def __init__(
        self,
        sinks: list[AlertSink],
        cfg: AlertsConfig,
        spool: Spool,
        *,
        run: str,
        clock: Callable[[], float],
        rng: Callable[[], float],
        backoff_base: float = BACKOFF_BASE_S,
        errors: dict[str, int] | None = None,
    ) -> None:
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"alert sink names must be unique: {names}")
        self.cfg = cfg
        self.spool = spool
        self.run = run
        self.clock = clock
        self.rng = rng
        self.backoff_base = backoff_base
        self.errors = errors if errors is not None else {}
        now = clock()
        retry = RetryPolicy.of(cfg, backoff_base)
        self.workers = {s.name: SinkWorker(s, Bucket(cfg.rate_limit_per_minute, now), retry) for s in sinks}
        self.stats: dict[str, dict[str, int]] = {
            n: {"sent": 0, "failed": 0, "dropped": 0, "retried": 0} for n in names
        }
        self._spool_lock = asyncio.Lock()
        self._spool_errors = 0
        # Told when alerts reached the outbox (the dispatcher writes its state file only then).
        self.on_outboxed: Callable[[], None] | None = None

    def outbox_pending(self) -> bool:
        """An alert is queued and not yet in the outbox: a state file saying it was announced
        would, after a SIGKILL now, make a restarted agent take it for delivered."""
        return any(not (i.spooled or i.refresh or i.dropped) for w in self.workers.values() for i in w.queue)

    def refresh_policy(self, cfg: AlertsConfig) -> None:
        """A reloaded config: each sink's retry policy is built again (a sink's own one stays)."""
        self.cfg = cfg
        retry = RetryPolicy.of(cfg, self.backoff_base)
        for w in self.workers.values():
            w.retry = getattr(w.sink, "retry_policy", None) or retry

    def wake(self) -> None:
        for w in self.workers.values():
            w.wake.set()

    def idle(self, now: float) -> bool:
        """Every sink's task waits with nothing due at ``now`` (tests: the clock was acted on)."""
        return all(w.due is not None and w.due > now and not w.wake.is_set() for w in self.workers.values())

    def refresh(self, now: float, active: Callable[[], list[AlertMessage]], any_active: bool) -> float:
        """Re-post the active alerts to the sinks that want it (best effort); the next due time."""
        due = float("inf")
        for w in self.workers.values():
            if not w.refresh_interval:
                continue
            if now >= w.next_refresh:
                w.next_refresh = now + w.refresh_interval
                if any_active and not w.queue:
                    for msg in active():
                        self.enqueue(msg, [w], refresh=True)
            if any_active:
                due = min(due, w.next_refresh)
        return due

    # --- lifecycle -------------------------------------------------------------------------
    async def load(self) -> Spooled:
        """Queue what the spool holds; returns the last spooled word per alert."""
        entries = await self._spool_op(self.spool.load) or []
        seen: set[str] = set()
        orphans: dict[str, str] = {}  # entry id -> sink name
        spooled: Spooled = {}
        for e in entries:
            if e.id in seen:
                continue
            seen.add(e.id)
            w = self.workers.get(e.sink)
            try:
                alert = AlertMessage.from_json(e.alert)
            except (TypeError, KeyError, ValueError):
                alert = None
            if w is None or alert is None:
                orphans[e.id] = e.sink
                continue
            w.queue.append(Item(alert, e.id, spooled=True))
            for m in alert.members:
                k = (m.rank, alert.kind, m.subject)
                spooled.pop(k, None)
                spooled[k] = (alert, m)
        if seen:
            log.info(
                "alert spool %s: %d undelivered alert(s) re-queued", self.spool.path, len(seen) - len(orphans)
            )
        if orphans:
            self._drop_orphans(orphans)
            await self._spool_op(self.spool.remove, set(orphans))
        return spooled

    def start(self) -> None:
        """A task per sink (again, after ``run`` was cancelled with them)."""
        for w in self.workers.values():
            if w.task is None or w.task.done():
                w.task = asyncio.get_running_loop().create_task(self._work(w), name=f"alerts-{w.name}")

    async def flush(self, deadline: float) -> None:
        """Deliver what is queued (refreshes left out) until ``deadline`` (real monotonic time)."""
        for w in self.workers.values():
            w.queue = deque(i for i in w.queue if not i.refresh)
        while any(w.queue for w in self.workers.values()) and time.monotonic() < deadline:
            await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    async def stop_tasks(self) -> None:
        await _cancel([w.task for w in self.workers.values() if w.task is not None])

    async def stop(self) -> None:
        """Stop the sinks' tasks; what is undelivered goes to the spool for the next start."""
        await self.stop_tasks()
        rest: list[SpoolEntry] = []
        for w in self.workers.values():
            for item in w.queue:
                if not item.spooled and not item.refresh and not item.dropped:
                    rest.append(SpoolEntry(item.entry_id, w.name, item.alert.to_json(), item.attempts))
                    item.spooled = True
        if rest:
            log.warning(
                "%d undelivered alert(s) written to %s for the next start", len(rest), self.spool.path
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._append(rest), 10.0)
        for w in self.workers.values():
            aclose = getattr(w.sink, "aclose", None)
            if callable(aclose):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(aclose(), 2.0)

    async def _sleep(self, w: SinkWorker, timeout: float | None) -> None:
        w.due = float("inf") if timeout is None else self.clock() + max(0.0, timeout)
        try:
            await _wait(w.wake, timeout)
        finally:
            w.due = None

    # --- one sink's task -------------------------------------------------------------------
    async def _work(self, w: SinkWorker) -> None:
        hard_timeout = float(getattr(w.sink, "timeout", 30.0)) + 5.0
        while True:
            w.wake.clear()
            while w.queue and w.queue[0].dropped:
                w.queue.popleft()
            if not w.queue:
                await self._sleep(w, None)
                continue
            item = w.queue[0]
            now = self.clock()
            if item.not_before > now:
                await self._spool_backlog(w)
                await self._sleep(w, item.not_before - now)
                continue
            pause = w.bucket.wait_time(now)
            if pause > 0:
                await self._spool_backlog(w)  # held back by the rate limit: on disk meanwhile
                await self._sleep(w, pause)
                continue
            alert = self._deliverable(w, item)
            if alert is None:
                _discard(w.queue, item)
                if item.spooled:
                    await self._spool_op(self.spool.remove, {item.entry_id})
                continue
            if not (item.spooled or item.refresh):
                # The outbox first: a SIGKILL during the attempt leaves it for the next start.
                await self._spool_backlog(w)
                if self.on_outboxed is not None:
                    self.on_outboxed()
            w.bucket.take()
            try:
                await asyncio.wait_for(w.sink.deliver(alert), hard_timeout)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                err = e if isinstance(e, DeliveryError) else DeliveryError(f"{type(e).__name__}: {e}")
                if not isinstance(e, DeliveryError):
                    log.debug("sink %s raised", w.name, exc_info=True)
                await self._failed(w, item, err)
            else:
                self.stats[w.name]["sent"] += 1
                if alert.status == "firing":
                    w.lost.difference_update((m.rank, alert.kind, m.subject) for m in alert.members)
                _discard(w.queue, item)
                if item.spooled:
                    await self._spool_op(self.spool.remove, {item.entry_id})

    def _deliverable(self, w: SinkWorker, item: Item) -> AlertMessage | None:
        """The alert as this sink may get it: a resolve without the members whose firing this
        sink never got (None when that is all of them: a resolve of nothing is not sent)."""
        alert = item.alert
        if alert.status != "resolved" or not w.lost:
            return alert
        keep = [m for m in alert.members if (m.rank, alert.kind, m.subject) not in w.lost]
        if len(keep) == len(alert.members):
            return alert
        gone = [m for m in alert.members if (m.rank, alert.kind, m.subject) in w.lost]
        w.lost.difference_update((m.rank, alert.kind, m.subject) for m in gone)
        log.warning(
            "alert %r to %s: not resolving rank(s) %s there, whose firing it never got",
            alert.title,
            w.name,
            ", ".join(sorted(str(m.rank) for m in gone)),
        )
        if not keep:
            return None
        return dataclasses.replace(alert, members=keep)

    async def _failed(self, w: SinkWorker, item: Item, err: DeliveryError) -> None:
        self.stats[w.name]["failed"] += 1
        if item.refresh:
            _discard(w.queue, item)
            return
        item.attempts += 1
        if err.permanent or item.attempts > w.retry.max_retries:
            why = "permanent error" if err.permanent else f"gave up after {item.attempts} attempts"
            self._drop(w, item, f"{why}: {err}")
            if item.alert.status == "firing":
                w.lost.update((m.rank, item.alert.kind, m.subject) for m in item.alert.members)
            _discard(w.queue, item)
            if item.spooled:
                await self._spool_op(self.spool.remove, {item.entry_id})
            return
        delay = w.retry.delay(item.attempts, self.rng(), err.retry_after)
        item.not_before = self.clock() + delay
        self.stats[w.name]["retried"] += 1
        log.info(
            "alert %r to %s failed (%s); retry %d in %.1fs",
            item.alert.title,
            w.name,
            err,
            item.attempts,
            delay,
        )
        await self._spool_backlog(w)

    async def _spool_backlog(self, w: SinkWorker) -> None:
        """While a sink fails, everything queued for it is undelivered: put it on disk."""
        fresh = [i for i in w.queue if not (i.spooled or i.refresh or i.dropped)]
        for i in fresh:
            i.spooled = True
        if fresh:
            await self._append([SpoolEntry(i.entry_id, w.name, i.alert.to_json(), i.attempts) for i in fresh])

    def _drop_orphans(self, orphans: dict[str, str]) -> None:
        """Undelivered alerts nobody can deliver any more are losses like any other: counted
        under the sink they were meant for (so a removed or renamed sink shows its loss)."""
        by_sink: dict[str, int] = {}
        for sink in orphans.values():
            by_sink[sink] = by_sink.get(sink, 0) + 1
        for sink, n in sorted(by_sink.items()):
            counts = self.stats.setdefault(sink, {"sent": 0, "failed": 0, "dropped": 0, "retried": 0})
            counts["dropped"] += n
            known = "unreadable" if sink in self.workers else "no longer configured"
            log.error("alert spool: %d alert(s) for sink %s dropped (%s)", n, sink, known)

    def _drop(self, w: SinkWorker, item: Item, why: str) -> None:
        if item.dropped:
            return
        item.dropped = True
        self.stats[w.name]["dropped"] += 1
        log.error("alert %r (run %s) to %s dropped: %s", item.alert.title, item.alert.run, w.name, why)

    async def _append(self, entries: list[SpoolEntry]) -> None:
        lost = await self._spool_op(self.spool.append, entries) or []
        for e in lost:
            w = self.workers.get(e.sink)
            item = next((i for i in w.queue if i.entry_id == e.id), None) if w else None
            if w is not None and item is not None:
                self._drop(w, item, f"spool full ({self.spool.max_bytes} bytes), oldest dropped")
            elif w is not None:
                self.stats[w.name]["dropped"] += 1
                log.error("alert %s to %s dropped: spool full", e.id, e.sink)

    async def _spool_op(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._spool_lock:
            try:
                return await fs(fn, *args, name="rankwatch-spool")
            except (OSError, asyncio.TimeoutError) as e:
                self._spool_errors += 1
                self.errors["alerts"] = self.errors.get("alerts", 0) + 1
                if self._spool_errors == 1:
                    log.error(
                        "alert spool %s unusable (%s); undelivered alerts will not survive a restart",
                        self.spool.path,
                        e,
                    )
                return None

    def enqueue(
        self, msg: AlertMessage, workers: Iterable[SinkWorker] | None = None, *, refresh: bool = False
    ) -> None:
        """Queue for every sink (or ``workers``); never blocks: each sink's task delivers."""
        for w in self.workers.values() if workers is None else workers:
            # A repeat and the resolve carry their firing's id: each queued copy its own entry.
            w.queue.append(Item(msg, f"{msg.id}:{uuid.uuid4().hex[:12]}:{w.name}", refresh=refresh))
            while len(w.queue) > MAX_QUEUE:
                self._drop(w, w.queue.popleft(), "the in-memory queue is full")
            w.wake.set()


def _discard(q: deque[Item], item: Item) -> None:
    with contextlib.suppress(ValueError):
        q.remove(item)


async def _cancel(tasks: list[asyncio.Task[Any]], limit_s: float = 5.0) -> None:
    """Cancel and reap. Cancelled again until done: on Python 3.11 ``asyncio.wait_for`` swallows a
    cancel that lands as its awaitable completes (a wake at that moment), and a single cancel
    left ``close`` waiting forever on a worker that went back to sleep."""
    pending = {t for t in tasks if not t.done()}
    end = time.monotonic() + limit_s
    while pending and time.monotonic() < end:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.05)
    for t in tasks:
        if t.done() and not t.cancelled():
            t.exception()  # retrieved: a worker that died is not reported again at exit


async def _wait(event: asyncio.Event, timeout: float | None) -> None:
    if timeout is not None:
        if timeout <= 0:
            return
        timeout = min(timeout, 3600.0)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
