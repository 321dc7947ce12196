"""The agent's own stderr (its log lines, the console findings) must not stall it either.

Under srun or ``| tee`` stderr is a pipe like stdout; when its reader stalls, a ``write(2)``
from the loop (a log line, a finding on the console) blocks the loop. ``StderrGuard`` puts a
pipe of our own under fd 2: every writer (Python's logging, ``print``, C code) writes into
it, and a daemon thread forwards to the real stderr when ``poll`` says it takes bytes, and
drops (counts) what it cannot pass within ``POLL_S`` once its pipe holds ``MAX_HELD`` bytes.
A regular file (``2> agent.log``) is left alone: it never holds a writer back.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import threading
import time

POLL_S = 0.25
PIPE_SIZE = 1 << 20  # F_SETPIPE_SZ: room for bursts of log lines while the pump writes
SMALL_WRITE = getattr(select, "PIPE_BUF", 4096)


class StderrGuard:
    def __init__(self, fd: int = 2) -> None:
        self.fd = fd
        self.dropped_bytes = 0
        self._real: int | None = None
        self._read: int | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def needed(fd: int = 2) -> bool:
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            return False
        return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)

    def install(self) -> bool:
        if self._real is not None or not self.needed(self.fd):
            return False
        try:
            real = os.dup(self.fd)
            r, w = os.pipe()
        except OSError:
            return False
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            import sys

            sys.stderr.flush()
        os.dup2(w, self.fd)
        os.close(w)
        os.set_inheritable(real, False)
        self._real, self._read = real, r
        self._thread = threading.Thread(target=self._pump, name="rankwatch-stderr", daemon=True)
        self._thread.start()
        return True

    def restore(self, timeout: float = 2.0) -> None:
        """Give fd 2 back; what the pump holds is forwarded for at most ``timeout`` seconds."""
        if self._real is None:
            return
        with contextlib.suppress(AttributeError, OSError, ValueError):
            import sys

            sys.stderr.flush()
        os.dup2(self._real, self.fd)  # our pipe's last writer goes: the pump sees its end
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            os.close(self._real)
            if self._read is not None:
                os.close(self._read)
        self._real = self._read = None

    def _writable(self, fd: int, timeout: float) -> bool:
        try:
            p = select.poll()
            p.register(fd, select.POLLOUT)
            return bool(p.poll(timeout * 1000))
        except (OSError, ValueError):
            return True

    def _pump(self) -> None:
        r, real = self._read, self._real
        assert r is not None and real is not None
        stuck_since: float | None = None
        with contextlib.suppress(OSError):
            while data := os.read(r, 1 << 16):
                while data:
                    stuck = stuck_since is not None and time.monotonic() - stuck_since >= POLL_S
                    if not self._writable(real, 0 if stuck else POLL_S):
                        stuck_since = stuck_since or time.monotonic()
                        if time.monotonic() - stuck_since >= POLL_S:
                            self.dropped_bytes += len(data)  # nobody reads stderr: let the agent go on
                            break
                        continue
                    stuck_since = None
                    try:
                        n = os.write(real, data[:SMALL_WRITE])
                    except BlockingIOError:
                        continue
                    data = data[n:]
