"""Undelivered alerts on disk, so an agent restart (or a sink down for an hour) loses nothing.

One JSON-lines file per run and rank, so the agents of several ranks on one node never
write the same file. Appends are fsync'd; removals and the size bound rewrite the file to
a temporary name and rename it over the old one, so a crash leaves either the old or the
new file, never half of one. A torn last line (crash mid-append) is skipped on load.
The methods block on disk: the dispatcher calls them in a thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("rankwatch.alerts.spool")


@dataclass
class SpoolEntry:
    id: str
    sink: str
    alert: dict[str, Any]
    attempts: int = 0

    def line(self) -> bytes:
        doc = {"v": 1, "id": self.id, "sink": self.sink, "attempts": self.attempts, "alert": self.alert}
        return (json.dumps(doc, separators=(",", ":"), default=str) + "\n").encode()


def write_durably(path: Path, data: bytes, tmp: Path) -> None:
    """Replace ``path`` by ``data`` so that a crash leaves the old file or the new one, never
    half of one: a temporary file beside it, synced, renamed over it, then the folder synced."""
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not keep the half copy as well
        raise
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def spool_path(spool_dir: str | Path, run: str, rank: int | None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run) or "default"
    return Path(spool_dir) / f"{safe}.rank-{'none' if rank is None else rank}.jsonl"


class Spool:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path = path
        self.max_bytes = max(0, int(max_bytes))
        self._lock = threading.Lock()

    def load(self) -> list[SpoolEntry]:
        with self._lock:
            return self._read()

    def append(self, entries: list[SpoolEntry]) -> list[SpoolEntry]:
        """Add entries; returns the oldest entries dropped to stay within ``max_bytes``."""
        if not entries:
            return []
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                data = memoryview(b"".join(e.line() for e in entries))
                try:
                    while data:
                        data = data[os.write(fd, data) :]
                    os.fsync(fd)
                except OSError:
                    # A full disk takes part of the write: cut it off, or the next append is
                    # glued to the torn line and lost with it on load.
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                    raise
            finally:
                os.close(fd)
            if self.path.stat().st_size <= self.max_bytes:
                return []
            kept = self._read()
            sizes = [len(e.line()) for e in kept]
            total = sum(sizes)
            cut = 0
            while cut < len(kept) and total > self.max_bytes:
                total -= sizes[cut]
                cut += 1
            self._rewrite(kept[cut:])
            return kept[:cut]

    def remove(self, ids: set[str]) -> None:
        if not ids:
            return
        with self._lock:
            entries = self._read()
            kept = [e for e in entries if e.id not in ids]
            if len(kept) != len(entries):
                self._rewrite(kept)

    def _read(self) -> list[SpoolEntry]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        out: list[SpoolEntry] = []
        bad = 0
        for line in raw.splitlines():
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.append(SpoolEntry(d["id"], d["sink"], d["alert"], int(d.get("attempts", 0))))
            except (ValueError, KeyError, TypeError):
                bad += 1
        if bad:
            log.warning("alert spool %s: skipped %d unreadable line(s)", self.path, bad)
        return out

    def _rewrite(self, entries: list[SpoolEntry]) -> None:
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        data = b"".join(e.line() for e in entries)
        write_durably(self.path, data, self.path.with_name(self.path.name + ".tmp"))
