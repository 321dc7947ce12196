"""Run mode's copy of the child's log to the agent's stdout, done so it can never stall the agent.

The agent's stdout may be a pipe nobody drains (a stuck ``| tee``, a stalled srun output
channel). A write to it then blocks; done on the event loop it froze NaN and stall detection,
``/healthz`` and ``/metrics`` while the child trained on unwatched. So the copy runs on a
thread of its own, writes only when ``poll`` says the stream can take the bytes (a pipe or
terminal gets ``PIPE_BUF``-sized writes, which then never block), and when the stream stays
full it skips ahead: what it cannot write within ``max_backlog`` bytes of the log's end is
dropped and counted (``rankwatch_echo_dropped_bytes_total``), said once in the agent's log
and once in the echo itself when it resumes. The log file always holds everything.

Our stdout's file status flags are left alone: ``O_NONBLOCK`` is shared by every process
holding that open file (the user's shell, on a terminal).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("rankwatch.run")

POLL_S = 0.25  # the file is read this often: wake-ups of a thread next to the rank cost its CPU
MAX_BACKLOG = 8 << 20  # unwritten bytes (read or not) beyond which the echo skips to the end
CHUNK = 1 << 20
# A pipe or terminal reporting POLLOUT takes at least this much without blocking.
SMALL_WRITE = getattr(select, "PIPE_BUF", 4096)


class Echo:
    """Copies ``path`` from ``start`` to ``fd`` on a daemon thread; never blocks its caller."""

    def __init__(
        self,
        path: Path,
        start: int,
        fd: int,
        *,
        max_backlog: int = MAX_BACKLOG,
        poll_s: float = POLL_S,
    ) -> None:
        self.path = path
        self.pos = start
        self.fd = fd
        self.max_backlog = max_backlog
        self.poll_s = poll_s
        self.written_bytes = 0
        self.dropped_bytes = 0
        self.failed: str | None = None  # our stdout is gone (EPIPE, closed): echo stops
        self._stop = threading.Event()
        self._deadline: float | None = None
        self._thread: threading.Thread | None = None
        self._told = False
        self._marker = b""
        try:
            mode = os.fstat(fd).st_mode
            # A regular file or /dev/null never holds a writer back for long: big writes.
            self._big = stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and not os.isatty(fd))
        except OSError as e:
            self._big = True
            self.failed = e.strerror or str(e)

    def start(self) -> None:
        if self.failed is not None:
            return
        self._thread = threading.Thread(target=self._run, name="rankwatch-echo", daemon=True)
        self._thread.start()

    async def close(self, timeout: float = 5.0) -> None:
        """Copy what the child wrote up to now, for at most ``timeout`` seconds; the rest is
        counted as dropped (a stdout nobody reads would otherwise hold the agent's exit)."""
        self._deadline = time.monotonic() + timeout
        self._stop.set()
        t = self._thread
        while t is not None and t.is_alive() and time.monotonic() < self._deadline + 0.5:
            await asyncio.sleep(0.02)

    # --- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                self._copy(fh)
        except _Done:
            pass
        except OSError as e:
            self.failed = e.strerror or str(e)
            log.warning("echo of %s to stdout stopped: %s (the log file has everything)", self.path, e)

    def _copy(self, fh: BinaryIO) -> None:
        pending = b""
        while True:
            stopping = self._stop.is_set()
            if stopping and self._past_deadline():
                self._maybe_skip(fh, pending, stopping)
            if not pending:
                pending = fh.read(CHUNK)
                self.pos += len(pending)
            if pending:
                if self._marker and self._writable(0):
                    self._write_all(self._marker)
                    self._marker = b""
                n = self._write_some(pending)
                if n is None:
                    return
                pending = pending[n:]
                if n == 0:
                    pending = self._maybe_skip(fh, pending, stopping)
                continue
            if stopping:
                return
            self._stop.wait(self.poll_s)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _maybe_skip(self, fh: BinaryIO, pending: bytes, stopping: bool) -> bytes:
        """Stdout took nothing for a poll interval: drop everything up to the log's end when
        the backlog is over the bound (or the agent is stopping and out of time)."""
        try:
            size = os.fstat(fh.fileno()).st_size
        except OSError:
            size = self.pos
        backlog = len(pending) + max(0, size - self.pos)
        late = stopping and self._past_deadline()
        if late and backlog == 0:
            raise _Done
        if backlog <= self.max_backlog and not late:
            return pending
        size = max(size, self.pos)
        fh.seek(size)
        self.pos = size
        self.dropped_bytes += backlog
        self._marker = (
            f"\n[rankwatch: {self.dropped_bytes} bytes of the rank's output not echoed so far: our "
            f"stdout was not being read; {self.path} has all of it]\n"
        ).encode()
        if not self._told:
            self._told = True
            log.warning(
                "stdout is not being read: dropped %d bytes of the rank's echo (all of it is in %s); "
                "further drops are only counted (rankwatch_echo_dropped_bytes_total)",
                backlog,
                self.path,
            )
        if late:
            raise _Done
        return b""

    def _writable(self, timeout: float) -> bool:
        if self._big:
            return True
        try:
            p = select.poll()
            p.register(self.fd, select.POLLOUT)
            return bool(p.poll(timeout * 1000))
        except (OSError, ValueError):
            return True

    def _write_some(self, data: bytes) -> int | None:
        """Bytes written (0: stdout full for a poll interval); None when stdout is gone."""
        if not self._writable(self.poll_s):
            return 0
        try:
            n = os.write(self.fd, data[:CHUNK] if self._big else data[:SMALL_WRITE])
        except BlockingIOError:
            return 0
        except OSError as e:
            self.failed = e.strerror or str(e)
            if e.errno not in (errno.EPIPE, errno.EBADF):
                log.warning("echo to stdout stopped: %s (the log file has everything)", e)
            return None
        self.written_bytes += n
        return n

    def _write_all(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            while data and self._writable(self.poll_s):
                n = os.write(self.fd, data[:SMALL_WRITE])
                data = data[n:]


class _Done(Exception):
    pass
