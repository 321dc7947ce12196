"""``tail -F`` for one log path: follows it across rotation (rename, or copytruncate, whose
copy gives back what was written since the last read), a late start (the launcher starts
before the first rank writes) and writes in pieces. The splitting itself (tqdm ``\\r``
redraws, multi-megabyte lines, bad UTF-8) is ``lines``'s, shared with the offline readers.

The agent may read with more rights than the job (root, ``CAP_DAC_READ_SEARCH``) in a
folder the job writes, so every open and reopen goes through ``safeio``: the folder as
configured (resolved once, when the follower is made), no symlink anywhere after that
but one to a file beside it (``latest.log -> run-7.log``), a regular file only, and
always the same owner: the owner of the first file read, or the user who owns the folder
or a symlink on the configured path when that is not root or the agent. A log swapped
for a symlink to a root-only file, a FIFO or a device is refused, logged once and
counted (``FollowerStats.refused_opens``); it is never opened.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import pathlib
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from rankwatch import offloop, safeio
from rankwatch.sources.lines import NOISE, RESCUE, FollowedLine, FollowerStats, Splitter, read_lines

__all__ = [
    "NOISE",
    "RESCUE",
    "FollowedLine",
    "FollowerStats",
    "LogFollower",
    "LogReader",
    "read_lines",
]

log = logging.getLogger("rankwatch.follower")

_FOLLOW_BATCH_BYTES = 128 << 10  # small batches: bounded loop latency and faster (cache, GC)
_OBSERVER_RETRY_S = 5.0
_MARK_BYTES = 64  # the last bytes read: copytruncate then a refill past our offset changes them
_SELF_EVENTS = frozenset({"opened", "closed_no_write"})  # caused by our own reads
# copytruncate's copy: at most this many recent siblings named after the log are looked at,
# and at most this much of the one whose bytes before our offset match is read (the bytes
# written since the last read: a poll's worth, or a backlog); a bound on the work, not a
# threshold of detection.
_COPY_CANDIDATES = 8
_COPY_SCAN_MAX = 4096  # names of the folder looked at: a folder another user filled stays cheap
_COPY_READ_MAX = 4 << 20
_PACKED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".z")  # compressed copies: not text to follow


class LogFollower:
    """Non-blocking reader of one path across rotations; the caller decides when to poll."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_line_bytes: int = 1 << 20,
        chunk_size: int = 1 << 20,
        from_end: bool = False,
        drop: str | None = None,
        encoding: str = "utf-8",
        lazy: bool = False,
        start_at: int | None = None,
    ) -> None:
        """``lazy``: touch nothing on disk until the first ``ensure_open`` or
        ``read_available``, which resolves the folder and opens the file (``from_end``: at its
        end then) on whatever thread reads (a log made on the event loop for a folder that may
        sit on a hung mount). ``start_at`` (with ``from_end``): the byte where the lines of
        interest began, known when the follower was made (the file a job's output starts to
        go to): the first open starts there instead of at the end, so that a lazy open that
        comes late loses nothing written meanwhile (the end if the file is shorter)."""
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.path = pathlib.Path(path)
        self.stats = FollowerStats()
        self.chunk_size = chunk_size
        self._splitter = Splitter(max_line_bytes, self.stats, str(self.path), drop=drop, encoding=encoding)
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        self._offset = 0
        self._mark = b""
        self._behind = False
        self._open_error_logged = False
        self._dir, self._dir_owners = os.path.abspath(self.path.parent), frozenset[int]()
        self._resolved = False
        self._owner: int | None = None  # pinned by the first file read
        self._refused: str | None = None  # the refusal last logged and counted
        self._from_end = from_end  # the first open attempt starts at the end (if the file is there)
        self._start_at = start_at
        if not lazy:
            self._open()

    def _resolve(self) -> None:
        """The folder as configured, resolved once (before the first open)."""
        self._resolved = True
        try:
            self._dir, self._dir_owners = safeio.resolve_dir(self.path.parent)
        except OSError:  # a symlink loop: every open is then refused, and says so
            pass

    @property
    def position(self) -> int:
        """Bytes of the current file consumed so far (after ``from_end``: where live reading starts)."""
        return self._offset

    def ensure_open(self) -> bool:
        """Open the file now if it is not (a lazy follower's first touch); whether it is open."""
        return self._fd is not None or self._open()

    @property
    def is_open(self) -> bool:
        """The file is open (found and accepted by the last open): no filesystem call, so the
        loop may ask while a read of it is in flight on another thread."""
        return self._fd is not None

    def count_lines_before(self, deadline: float | None = None) -> int | None:
        """Newlines before the read position (after ``from_end``: lines the file held already);
        None once ``time.monotonic()`` passes ``deadline`` (a file too big to count in time).
        Only reads (``pread``); ~1 GB/s from the page cache."""
        fd, end = self._fd, self._offset
        if fd is None:
            return 0
        n = pos = 0
        while pos < end:
            if deadline is not None and time.monotonic() > deadline:
                return None
            chunk = os.pread(fd, min(1 << 20, end - pos), pos)
            if not chunk:
                break
            n += chunk.count(b"\n")
            pos += len(chunk)
        return n

    def number_from(self, first: int) -> None:
        """The next line read is line ``first`` (its number in the file, not since attaching)."""
        self._splitter.lineno = first

    def backlog(self) -> int:
        """Bytes written to the current file beyond the read position (one ``fstat``)."""
        if self._fd is None:
            return 0
        try:
            return max(0, os.fstat(self._fd).st_size - self._offset)
        except OSError:
            return 0

    @property
    def behind(self) -> bool:
        """True when the last ``read_available`` stopped at ``max_bytes`` with more to read."""
        return self._behind

    def read_available(
        self, max_bytes: int | None = None, thin: Callable[[str], bool] | None = None
    ) -> list[FollowedLine]:
        """Everything complete that is new since the last call; never blocks.

        Opens the file once it exists and follows rotation and truncation.  ``max_bytes``
        bounds the work of one call so a live agent can interleave; ``behind`` then says
        whether more is waiting. ``thin``: a test over a piece's text (up to 32 KiB of lines);
        a piece it finds nothing in gives its last line only (``FollowerStats.thinned_lines``
        counts the rest): how a reader far behind catches up in seconds.
        """
        self._splitter.thin = thin
        out: list[FollowedLine] = []
        self._behind = False
        if self._fd is None and not self._open():
            return out
        if self._mark and self._rewritten():
            self._restart("truncated and rewritten past the read position", out)
        budget = max_bytes if max_bytes is not None else -1
        while True:
            if budget == 0:
                self._behind = True
                return out
            want = self.chunk_size if budget < 0 else min(self.chunk_size, budget)
            data = self._read(want)
            if data is None:
                return out
            if data:
                if budget > 0:
                    budget -= len(data)
                self._splitter.feed(data, out)
                if len(data) == want:
                    continue
            if not self._check_generation(out):
                return out

    def flush(self) -> list[FollowedLine]:
        """The held unterminated line, for end of file and shutdown, where no terminator will come."""
        out: list[FollowedLine] = []
        self._splitter.flush(out)
        return out

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[FollowedLine]:
        """Everything available now, then the held partial line: what ``analyze`` wants."""
        while True:
            batch = self.read_available(self.chunk_size * 8)
            yield from batch
            if not self._behind:
                break
        yield from self.flush()

    def read_back(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the file being followed, through the descriptor already
        checked (a second open by name could land on whatever the job swapped in since)."""
        if self._fd is None or end <= start:
            return b""
        return os.pread(self._fd, end - start, start)

    def read_back_lines(self, start: int, end: int) -> list[FollowedLine]:
        """Bytes ``[start, end)`` as the lines live reading would have given, numbered from 1:
        the same splitter, encoding, length cut and dropped noise, with a split of its own (live
        reading's position and counters are left alone). A line cut by ``start`` is skipped."""
        sp = self._splitter
        splitter = Splitter(sp.max_line_bytes, FollowerStats(), sp.label, sp.drop, sp.encoding)
        out: list[FollowedLine] = []
        data = self.read_back(start, end)
        if start > 0 and self.read_back(start - 1, start) != b"\n":
            cut = data.find(b"\n")
            data = data[cut + 1 :] if cut >= 0 else b""
        splitter.feed(data, out)
        splitter.flush(out)
        return out

    def _open(self) -> bool:
        if not self._resolved:
            self._resolve()
        from_end, self._from_end = self._from_end, False  # the first attempt only
        try:
            fd, st = self._open_checked()
        except FileNotFoundError:
            return False
        except safeio.Refused as exc:
            self._open_refused(exc)
            return False
        except OSError as exc:
            self._open_failed(exc)
            return False
        if self._owner is None:
            self._owner = st.st_uid
        self._refused = None
        identity = (st.st_dev, st.st_ino)
        if identity == self._identity and st.st_size >= self._offset:
            os.lseek(fd, self._offset, os.SEEK_SET)
        else:
            self._identity = identity
            self._offset = 0
            self._mark = b""
            self._splitter.reset()
        self._fd = fd
        self._open_error_logged = False
        if from_end:
            if self._start_at is not None and 0 <= self._start_at <= st.st_size:
                self._seek_to(self._start_at)
            else:
                self._seek_to_end()
        return True

    def _open_checked(self) -> tuple[int, os.stat_result]:
        dfd = safeio.open_dir(self._dir)
        try:
            return safeio.open_file_beneath(
                dfd, [self.path.name], label=self._dir, owners=self._owners(os.fstat(dfd)), sibling_link=True
            )
        finally:
            os.close(dfd)

    def _lstat_current(self) -> os.stat_result:
        """What an open now would find: the file under the name, or the sibling a symlink
        there names; a symlink out of the folder is a new file (its open is then refused)."""
        where = os.path.join(self._dir, self.path.name)
        st = os.lstat(where)
        if stat.S_ISLNK(st.st_mode) and (name := safeio.sibling(os.readlink(where), self._dir)):
            st = os.lstat(os.path.join(self._dir, name))
        return st

    def _owners(self, folder: os.stat_result) -> frozenset[int] | None:
        """Whose file may be read here; None: anyone's, the first time only (then pinned)."""
        if self._owner is not None:
            return frozenset({self._owner})
        if self._dir_owners:
            return self._dir_owners
        if folder.st_uid not in safeio.trusted_uids() and not folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return frozenset({folder.st_uid})  # a user's own folder: only their files
        return None

    def _open_refused(self, exc: safeio.Refused) -> None:
        """Once per change of what is there, not per poll; the target is never opened."""
        if exc.why == self._refused:
            return
        self._refused = exc.why
        self.stats.refused_opens += 1
        log.warning(
            "%s: refusing to open it: %s (the agent reads only a regular file owned by the job's "
            "user, never through a symlink; it reads on once the file is back)",
            self.path,
            exc.why,
        )

    def _open_failed(self, exc: OSError) -> None:
        self.stats.reopen_errors += 1
        if not self._open_error_logged:
            self._open_error_logged = True
            log.warning("%s: cannot open: %s", self.path, exc)

    def _seek_to(self, offset: int) -> None:
        assert self._fd is not None
        self._offset = offset
        os.lseek(self._fd, offset, os.SEEK_SET)
        n = min(_MARK_BYTES, offset)
        self._mark = os.pread(self._fd, n, offset - n) if n else b""

    def _seek_to_end(self) -> None:
        """Start after the last complete line so the first item is never a line fragment."""
        assert self._fd is not None
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        window = min(size, self._splitter.max_line_bytes)
        tail = os.pread(self._fd, window, size - window)
        last = max(tail.rfind(b"\n"), tail.rfind(b"\r"))
        if last >= 0:
            self._offset = size - window + last + 1
        elif window == size:
            self._offset = 0
        else:
            self._offset = size
            self._splitter.discarding = True
        os.lseek(self._fd, self._offset, os.SEEK_SET)
        n = min(_MARK_BYTES, self._offset)
        self._mark = os.pread(self._fd, n, self._offset - n) if n else b""

    def _read(self, want: int) -> bytes | None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, want)
        except OSError as exc:
            # e.g. ESTALE on NFS: reopen later; _open resumes at the offset if it is the same file.
            log.warning("%s: read failed, will reopen: %s", self.path, exc)
            self.stats.reopen_errors += 1
            self.close()
            return None
        self._offset += len(data)
        self.stats.bytes_read += len(data)
        if data:
            self._mark = (
                data[-_MARK_BYTES:] if len(data) >= _MARK_BYTES else (self._mark + data)[-_MARK_BYTES:]
            )
        return data

    def _rewritten(self) -> bool:
        """The bytes before our offset are not the ones we read: truncated, then refilled
        past the offset before we looked (the size check alone cannot see that)."""
        assert self._fd is not None
        n = len(self._mark)
        try:
            return os.pread(self._fd, n, self._offset - n) != self._mark
        except OSError:
            return False

    def _restart(self, why: str, out: list[FollowedLine]) -> None:
        assert self._fd is not None
        copy = self._read_copy(out)
        if copy:
            log.warning(
                "%s: %s, reading from the start (what was written since the last read came from its copy %s)",
                self.path,
                why,
                copy,
            )
        else:
            log.warning("%s: %s, reading from the start", self.path, why)
        self.stats.truncations += 1
        self._splitter.flush(out)
        self._splitter.reset()
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._offset = 0
        self._mark = b""

    def _read_copy(self, out: list[FollowedLine]) -> str | None:
        """copytruncate (logrotate): the file was copied, then truncated in place, so the bytes
        written between our last read and the copy are in the copy only. Read them from it: a
        sibling named after the log (``train.log.1``, ``train.log-20261129``), a regular file of
        the log's owner, whose bytes just before our offset are the last ones we read. Returns
        its name, or None (no such copy: those bytes are lost, as ``tail -F`` loses them)."""
        if not self._mark or self._owner is None:
            return None
        try:
            dfd = safeio.open_dir(self._dir)
        except OSError:
            return None
        try:
            for name in self._copy_candidates(dfd):
                try:
                    fd, st = safeio.open_file_beneath(dfd, [name], label=self._dir, owners={self._owner})
                except OSError:  # gone, refused (a symlink, another user's file): not the copy
                    continue
                try:
                    n = len(self._mark)
                    if st.st_size < self._offset or os.pread(fd, n, self._offset - n) != self._mark:
                        continue
                    pos, end = self._offset, min(st.st_size, self._offset + _COPY_READ_MAX)
                    while pos < end and (data := os.pread(fd, min(self.chunk_size, end - pos), pos)):
                        self._splitter.feed(data, out)
                        pos += len(data)
                    self.stats.bytes_read += pos - self._offset
                    if st.st_size > end:
                        log.warning(
                            "%s: its copy %s holds %d more bytes than read back from it",
                            self.path,
                            name,
                            st.st_size - end,
                        )
                    return name
                finally:
                    os.close(fd)
        except OSError as exc:
            log.debug("%s: looking for its copy: %s", self.path, exc)
        finally:
            os.close(dfd)
        return None

    def _copy_candidates(self, dfd: int) -> list[str]:
        """Siblings named after the log (its name, then ``.``, ``-`` or ``_``), not compressed,
        the most recently changed first, among the folder's first ``_COPY_SCAN_MAX`` names."""
        base = self.path.name
        found: list[tuple[float, str]] = []
        with os.scandir(dfd) as entries:
            for entry in itertools.islice(entries, _COPY_SCAN_MAX):
                name = entry.name
                if (
                    len(name) > len(base)
                    and name.startswith(base)
                    and name[len(base)] in ".-_"
                    and not name.lower().endswith(_PACKED)
                ):
                    try:
                        found.append((entry.stat(follow_symlinks=False).st_mtime, name))
                    except OSError:
                        continue
        found.sort(reverse=True)
        return [name for _, name in found[:_COPY_CANDIDATES]]

    def _check_generation(self, out: list[FollowedLine]) -> bool:
        """At end of file: True when reading should go on (file truncated or replaced)."""
        assert self._fd is not None
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            size = self._offset
        if size < self._offset:
            self._restart(f"truncated ({self._offset} -> {size} bytes)", out)
            return True
        try:
            st = self._lstat_current()
        except OSError:
            return False  # moved away and not recreated yet: the open descriptor is still right
        if (st.st_dev, st.st_ino) == self._identity:
            return False
        self._drain(out)
        self._splitter.flush(out)
        self.close()
        self._identity = None
        if not self._open():
            return False
        log.info("%s: rotated, now reading the new file", self.path)
        self.stats.rotations += 1
        return True

    def _drain(self, out: list[FollowedLine]) -> None:
        """Bytes written to the old file between the last read and the rename."""
        while data := self._read(self.chunk_size):
            self._splitter.feed(data, out)


class _StopRace(logging.Filter):
    """watchdog's inotify emitter logs ``ERROR ... queue_events() called when the thread is
    inactive`` when an event arrives while its observer is being stopped (watchdog 6, its
    ``on_thread_stop``): a harmless race at every agent exit that read as a failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "called when the thread is inactive" not in record.getMessage()


_STOP_RACE = _StopRace()


def quiet_watchdog_stop_race() -> None:
    """Drop watchdog's stop-race line (only that one) from its inotify logger; idempotent."""
    logger = logging.getLogger("watchdog.observers.inotify")
    if _STOP_RACE not in logger.filters:
        logger.addFilter(_STOP_RACE)


class _Waker:
    """Watchdog observer on the parent directory; its events only call ``wake`` (thread-safe,
    coalescing: ``offloop.threadsafe_waker``). Started and stopped from any thread: a log's
    reads, the watch among them, run off the loop."""

    def __init__(self, path: pathlib.Path, wake: Callable[[], None]) -> None:
        self._path = path
        self._wake = wake
        self._observer: Any = None
        self._next_try = 0.0
        self._lock = threading.Lock()
        self._stopped = False

    def ensure_started(self) -> None:
        if self._observer is not None or self._stopped or time.monotonic() < self._next_try:
            return
        self._next_try = time.monotonic() + _OBSERVER_RETRY_S
        try:
            from watchdog.events import (
                DirMovedEvent,
                FileClosedEvent,
                FileCreatedEvent,
                FileDeletedEvent,
                FileMovedEvent,
                FileSystemEvent,
                FileSystemEventHandler,
            )
            from watchdog.observers import Observer
        except ImportError:
            self._next_try = float("inf")
            return
        parent = self._path.parent
        if not parent.is_dir():
            return
        name = self._path.name
        wake = self._wake

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.event_type in _SELF_EVENTS:
                    return
                for p in (event.src_path, getattr(event, "dest_path", "")):
                    if p and os.path.basename(os.fsdecode(p)) == name:
                        wake()
                        return

        quiet_watchdog_stop_race()
        observer = Observer()
        try:
            # Which-file events only (and a writer closing it). A wake-up per write (IN_MODIFY)
            # cost a run-mode agent five times its CPU (bench_overhead.py); new data in an open
            # file waits for the next poll (logs.poll_interval) instead.
            events = [FileCreatedEvent, FileDeletedEvent, FileMovedEvent, DirMovedEvent, FileClosedEvent]
            observer.schedule(Handler(), str(parent), recursive=False, event_filter=events)
            observer.start()
        except Exception as exc:  # inotify limits, vanished directory: polling still works
            log.debug("%s: no filesystem watch, polling only: %s", self._path, exc)
            with contextlib.suppress(Exception):
                observer.stop()
            return
        with self._lock:
            late = self._stopped
            if not late:
                self._observer = observer
        if late:  # stopped while it started
            observer.stop()
            observer.join(timeout=2)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            observer, self._observer = self._observer, None
        if observer is not None:
            observer.stop()
            observer.join(timeout=2)


class LogReader:
    """One followed log read off the event loop: ``fill`` (blocking, on the thread of the
    rank's log source) reads what is new into ``ready``; the loop ``take``s the batches.
    Every filesystem call on the log runs there: the first open (``attach``: at the end of
    a file followed from its end, its earlier lines counted and up to ``replay`` bytes of
    its history read back into ``history``), every read, and the close (``close``).

    The follower is not thread-safe, so ``lock`` makes one owner of its descriptor and
    offset at a time: the source's thread while it reads, the loop (``owned``, a bounded
    wait) while it flushes the held line at exit. A read that hangs (a dead NFS or Lustre
    mount) holds the lock: the loop gives up on it after its wait and goes on without that
    log. A read that returns after its sample was given up on keeps its lines in ``ready``:
    they are taken with the next ones, never lost."""

    def __init__(
        self,
        follower: LogFollower,
        max_bytes: int = _FOLLOW_BATCH_BYTES,
        thin: Callable[[], Callable[[str], bool] | None] | None = None,
        *,
        count: bool = False,
        replay: int = 0,
        count_s: float = 10.0,
        watch: bool = False,
    ) -> None:
        """``count``: number the lines from the file's start (a follower started at the end)
        when counting them takes at most ``count_s``; ``replay``: bytes of history before the
        start read back by ``attach``; ``watch``: ``fill`` starts the folder's watch (an
        observer and its inotify threads), whose events call its ``wake`` between polls."""
        self.follower = follower
        self.max_bytes = max_bytes
        self.thin = thin
        self.count = count
        self.count_s = count_s
        self.replay = replay
        self.lock = threading.Lock()
        self.ready: collections.deque[list[FollowedLine]] = collections.deque()
        self.history: collections.deque[list[FollowedLine]] = collections.deque()  # to replay, until taken
        self.attached = False
        self.behind = False  # the last read stopped at ``max_bytes`` with more to read
        self.closed = False
        self.abandoned = False  # the loop gave up waiting for a read of it (hung): never waited for again
        self._wake: Callable[[], None] | None = None
        self._waker = _Waker(follower.path, self._woken) if watch else None

    def _woken(self) -> None:
        wake = self._wake
        if wake is not None:
            wake()

    def attach(self) -> None:
        """Blocking, once: the file's first open; its earlier lines counted and its history
        read back (see the class). Any thread; ``fill`` does it first when nobody has."""
        with self.lock:
            self._attach()

    def _attach(self) -> None:
        if self.attached or self.closed:
            return
        self.attached = True
        f = self.follower
        if not f.ensure_open():
            return
        if self.count:
            try:
                n = f.count_lines_before(time.monotonic() + self.count_s)
            except OSError as e:
                n, why = None, str(e)
            else:
                why = "slow"
            if n is None:
                log.warning("%s: lines not counted (%s): line numbers start where reading did", f.path, why)
            else:
                f.number_from(n + 1)
        if self.replay > 0:
            end = f.position
            try:
                # The one splitter, as live reading: a form feed or U+2028 inside a line is no
                # line break, and the segments of a \r progress bar keep their line's number.
                self.history.append(f.read_back_lines(max(0, end - self.replay), end))
            except OSError as e:
                log.warning("%s: cannot replay its history: %s", f.path, e)

    def take_history(self) -> list[FollowedLine] | None:
        """The history ``attach`` read back, once (None: none, or not read yet); any thread."""
        try:
            return self.history.popleft()
        except IndexError:
            return None

    def pending(self) -> bool:
        """Something for the loop: batches or history not taken, or closed (any thread)."""
        return bool(self.ready or self.history) or self.closed

    def fill(self, wake: Callable[[], None] | None = None) -> bool:
        """Blocking: one read of at most ``max_bytes``, its lines queued (an empty batch when
        the file grew by dropped noise only: still a sign of life); with ``wake`` and ``watch``, the
        folder's watch is started first (its events call ``wake``). True when more is waiting."""
        with self.lock:
            if self.closed:
                return False
            self._attach()
            if wake is not None and self._waker is not None:
                self._wake = wake
                self._waker.ensure_started()
            f = self.follower
            before = f.stats.bytes_read
            batch = f.read_available(self.max_bytes, self.thin() if self.thin is not None else None)
            if batch or f.stats.bytes_read != before:
                self.ready.append(batch)
            self.behind = f.behind
            self.abandoned = False
            return self.behind

    def take(self) -> list[FollowedLine] | None:
        """The oldest batch read and not taken yet (None: none); any thread."""
        try:
            return self.ready.popleft()
        except IndexError:
            return None

    @contextlib.contextmanager
    def owned(self, wait: float) -> Iterator[bool]:
        """The follower for the loop: True once no read of it is in flight (waiting at most
        ``wait`` seconds, and not at all for a read that hung before), False when one is stuck."""
        got = self.lock.acquire(timeout=0 if self.abandoned else wait)
        if not got:
            self.abandoned = True
        try:
            yield got
        finally:
            if got:
                self.lock.release()

    def unwatch(self) -> None:
        """Blocking: stop the folder's watch (joins its thread); no later read starts it again."""
        if self._waker is not None:
            self._waker.stop()

    def unwatch_on(self, thread: str) -> None:
        """``unwatch`` on the thread named ``thread`` (an inotify watch's removal on a hung
        mount blocks); returns at once."""
        offloop.start(self._quietly(self.unwatch), thread)

    def close(self, thread: str) -> None:
        """No read after this; returns at once. The watch is stopped and the descriptor closed
        on the thread named ``thread`` (the rank's log source's), after any read in flight
        returns: a close on a hung mount blocks that thread, never the caller."""
        self.closed = True

        def work() -> None:
            self.unwatch()
            with self.lock:
                self.follower.close()

        offloop.start(self._quietly(work), thread)

    def _quietly(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except Exception:
                log.exception("%s: closing it failed", self.follower.path)

        return run
