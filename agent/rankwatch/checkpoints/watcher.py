"""The live checkpoint watcher: filesystem events where they work, polling where they do not.

inotify is silent for writes made by other nodes on NFS/Lustre, so events only wake the
scan early; a slow poll is always the safety net (``mode: poll`` drops events for a
faster poll). The watcher is a polled source (``sources/polled/checkpoint_scan.py``): its
scans and verification run off the loop under the policy every source has, so a
filesystem stuck in uninterruptible I/O can hang that thread but never the agent's event
loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rankwatch.checkpoints import layouts as L
from rankwatch.checkpoints.catalog import Catalog, Entry
from rankwatch.config.schema import CheckpointConfig
from rankwatch.events import CheckpointEvent, CheckpointScan, CheckpointStatus, Event, next_save_due
from rankwatch.records import POISON_KINDS, EvalRecord, Finding, Severity, StepRecord
from rankwatch.sources.follower import quiet_watchdog_stop_race

log = logging.getLogger("rankwatch.checkpoints")

EVENT_POLL_S = 60.0
PLAIN_POLL_S = 10.0
MISSING_DIR_POLL_S = 5.0
SCAN_TIMEOUT_S = 120.0  # a scan still running after this long is said once (a hung filesystem?)
MIN_GAP_S = 1.0


def open_for_writing(path: Path) -> bool:
    """True when a process on this node holds ``path`` (or a file under it) open for writing:
    a save still in progress, however long its writer has been silent. Processes the agent
    may not inspect are skipped (so another node's writer is not seen)."""
    import psutil

    target = os.path.realpath(path)
    inside = target.rstrip("/") + "/"
    for proc in psutil.process_iter():
        try:
            files = proc.open_files()
        except (psutil.Error, OSError):
            continue
        for f in files:
            mode = getattr(f, "mode", "") or ""
            if (f.path == target or f.path.startswith(inside)) and any(m in mode for m in "wa+"):
                return True
    return False


class _Events:
    """A watchdog observer whose only job is to wake the scan early (``wake``: thread-safe).

    Recursive on the checkpoint directory; while that does not exist yet, on its nearest
    existing ancestor, so its creation wakes the scan too.
    """

    def __init__(self, root: Path, wake: Callable[[], None]) -> None:
        self.root = root
        self.wake = wake
        self.observer: Any = None
        self.target: Path | None = None
        self.failed = False
        self.closed = False
        self._lock = threading.Lock()

    def ensure(self, target: Path | None) -> None:
        """Watch ``target`` (found by the scan thread: a stat may hang, the loop must not)."""
        with self._lock:  # never beside close(): a scan finishing late must not start a watch
            if not self.closed:
                self._ensure(target)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self.stop()

    def _ensure(self, target: Path | None) -> None:
        if self.failed or target is None:
            return
        if target == self.target and self.observer is not None:
            return
        self.stop()
        try:
            from watchdog.events import FileSystemEvent, FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError:
            self.failed = True
            return
        wake = self.wake

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type not in ("opened", "closed_no_write"):
                    wake()

        quiet_watchdog_stop_race()
        observer = Observer()
        try:
            observer.schedule(Handler(), str(target), recursive=target == self.root)
            observer.start()
        except Exception as exc:  # inotify watch limit, a filesystem without events: poll
            log.info("%s: no filesystem events (%s); polling", target, exc)
            with contextlib.suppress(Exception):
                observer.stop()
            self.failed = True
            return
        self.observer, self.target = observer, target

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=2)
            self.observer, self.target = None, None


class CheckpointWatcher:
    """Watches one checkpoint directory for the live agent.

    ``clock`` is monotonic (settle times); ``wall`` is compared with file mtimes. Each
    ``sample`` (blocking) returns what the scan found wrong or cleared (checkpoint events
    for the checkpoint rules), the scan itself (``CheckpointScan``, for the stale and
    free-space rules) and each new tail of HF ``log_history`` (records, for a rank whose log
    shows no steps). The agent passes every finding of the run to ``on_finding`` so
    checkpoints saved after a NaN are marked suspect, and reads ``status`` to give the
    stall detector extra time while a save is written.
    """

    def __init__(
        self,
        dir: Path | str,
        cfg: CheckpointConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        statvfs: Callable[[str], os.statvfs_result] | None = None,
        writers: Callable[[Path], bool] | None = open_for_writing,
    ) -> None:
        self.root = Path(dir)
        self.cfg = cfg or CheckpointConfig()
        self.clock = clock
        self.wall = wall
        self.statvfs = statvfs or os.statvfs
        self.last_scan: CheckpointScan | None = None  # from the last tick
        self.history: list[StepRecord | EvalRecord] = []  # from the last tick
        self.catalog = Catalog(self.root, self.cfg, clock=clock, wall=wall, writers=writers)
        self.started = wall()
        self.fs_free: int | None = None
        self.fs_total: int | None = None
        self.scans = 0
        self.errors = 0
        self._queued: deque[tuple[int | None, str, float | None]] = deque(maxlen=64)
        self._exists = False
        self._free_read = False
        self.events_active = False  # filesystem events are being received (else: polling only)
        self._events_failed = False
        self._watch_target: Path | None = None
        self._wake: Callable[[], None] | None = None
        self._events: _Events | None = None

    # --- the API the agent uses ---------------------------------------------------------

    @property
    def writing(self) -> bool:
        return self.catalog.writing()

    def write_age(self) -> float | None:
        return self.catalog.write_age()

    def last_good(self) -> Entry | None:
        return self.catalog.last_good()

    def mark_bad_from(self, step: int | None, kind: str, time: float | None = None) -> list[Entry]:
        return self.catalog.mark_bad_from(step, kind, time=time)

    def on_finding(self, finding: Finding) -> None:
        if finding.kind not in POISON_KINDS or finding.resolved or finding.severity < Severity.WARNING:
            return
        when = finding.time if finding.time is not None else self.wall()
        if self.catalog.lock.acquire(blocking=False):
            try:
                self.catalog.mark_bad_from(finding.step, finding.kind, time=when)
            finally:
                self.catalog.lock.release()
        else:  # a scan holds the lock: apply at its end rather than block the loop
            self._queued.append((finding.step, finding.kind, when))
            if self._wake is not None:
                self._wake()

    def snapshot(self) -> dict[str, Any]:
        now = self.wall()
        cat = self.catalog
        newest = cat.newest_judged()
        good = cat.last_good()
        return {
            "dir": str(self.root),
            "dir_exists": self._exists,
            "last_checkpoint_name": newest.name if newest else None,
            "last_checkpoint_step": newest.step if newest else None,
            "last_checkpoint_timestamp_seconds": newest.saved_at if newest else None,
            "last_checkpoint_bytes": newest.size if newest else None,
            "last_save_duration_seconds": newest.save_duration if newest else None,
            "last_checkpoint_status": newest.status if newest else None,
            "last_good_name": good.name if good else None,
            "last_good_step": good.step if good else None,
            "last_good_timestamp_seconds": good.saved_at if good else None,
            "seconds_since_last_good": now - good.saved_at if good else None,
            "checkpoints": cat.counts(),
            "writing": cat.writing(),
            "events_active": self.events_active,
            "fs_free_bytes": self.fs_free,
            "fs_size_bytes": self.fs_total,
            "next_checkpoint_bytes": cat.next_size(),
            "max_age_seconds": self.cfg.stale_limit(cat.save_times),
            "next_save_due_timestamp_seconds": next_save_due(cat.save_times),
            "poisoned_from_step": cat.bad.step if cat.bad else None,
            "scans_total": self.scans,
            "errors_total": self.errors,
        }

    # --- one round ------------------------------------------------------------------------

    def tick(self) -> list[CheckpointEvent]:
        """Scan and judge what completed: what is found wrong or cleared. Free space and the
        newest good save go in ``last_scan`` (the stale and free-space rules judge it in the
        engine). Blocking I/O."""
        self._drain()
        scan = L.scan(
            self.root, glob=self.cfg.glob, step_regex=self.cfg.step_regex, max_depth=self.cfg.max_depth
        )
        found = self.catalog.update(scan)
        self.history = self.catalog.new_history()
        self._drain()
        self._exists = scan.exists
        self.scans += 1
        self._statvfs()
        good = self.catalog.last_good()
        self.last_scan = CheckpointScan(
            now=self.clock(),
            wall=self.wall(),
            root=str(self.root),
            started=self.started,
            save_times=tuple(self.catalog.save_times),
            last_good=good.saved() if good is not None else None,
            free=self.fs_free if self._free_read else None,
            next_size=self.catalog.next_size(),
        )
        return found

    def _drain(self) -> None:
        while self._queued:
            step, kind, when = self._queued.popleft()
            self.catalog.mark_bad_from(step, kind, time=when)

    def _statvfs(self) -> None:
        probe = self.root
        while not probe.is_dir() and probe != probe.parent:
            probe = probe.parent
        self._watch_target = probe
        self._free_read = False
        try:
            st = self.statvfs(str(probe))
        except OSError as exc:
            log.debug("statvfs %s: %s", probe, exc)
            return
        self.fs_free = st.f_bavail * st.f_frsize
        self.fs_total = st.f_blocks * st.f_frsize
        self._free_read = True

    def interval(self) -> float:
        """Seconds to the next scan: the poll, shorter while a save settles or the folder is missing."""
        set_to = self.cfg.poll_interval
        if set_to is not None:
            base = float(set_to)
        else:
            base = PLAIN_POLL_S if self.cfg.mode == "poll" or self._events_failed else EVENT_POLL_S
        if not self._exists:
            return min(base, MISSING_DIR_POLL_S)
        if self.catalog.pending():
            return max(0.05, min(base, float(self.cfg.settle) / 2))
        return base

    def min_gap(self) -> float:
        """A big save is a storm of write events: rescan at most this often."""
        return min(MIN_GAP_S, float(self.cfg.settle) / 4)

    # --- as a polled source -----------------------------------------------------------------

    def bind(self, wake: Callable[[], None]) -> None:
        """Filesystem events (``mode: auto``) and a poisoning finding call ``wake`` (thread-safe)."""
        self._wake = wake
        if self.cfg.mode != "poll":
            self._events = _Events(self.root, wake)

    def sample(self) -> list[Event]:
        """One scan, then the filesystem watch it calls for (watchdog's setup walks the tree
        and a stat on a hung NFS mount blocks, so neither may run on the event loop). Blocking."""
        try:
            out: list[Event] = list(self.tick())
            if self._events is not None:
                self._events.ensure(self._watch_target)
                self.events_active = self._events.observer is not None
                self._events_failed = self._events.failed
        except Exception:
            self.errors += 1
            raise
        scan, self.last_scan = self.last_scan, None
        if scan is not None:
            out.append(scan)
        records, self.history = self.history, []
        out.extend(records)
        return out

    def close(self) -> None:
        """Stop the filesystem watch (joins watchdog's thread: off the loop)."""
        if self._events is not None:
            self._events.close()

    def status(self) -> CheckpointStatus:
        """What the stall and time-limit rules read every second: cheap, on the loop."""
        snap = self.snapshot()
        return CheckpointStatus(
            now=0.0,
            scans=self.scans,
            writing=bool(self.writing),
            write_age=self.write_age(),
            last_saved=snap.get("last_checkpoint_timestamp_seconds"),
            next_due=snap.get("next_save_due_timestamp_seconds"),
        )
