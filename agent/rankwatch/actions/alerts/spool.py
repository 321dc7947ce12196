"""Undelivered alerts on disk, so an agent restart (or a sink down for an hour) loses nothing.

One JSON-lines file per run and rank, so the agents of several ranks on one node never
write the same file. Appends are fsync'd; removals and the size bound rewrite the file to
a temporary name and rename it over the old one, so a crash leaves either the old or the
new file, never half of one. A torn last line (crash mid-append) is skipped on load.
The methods block on disk: the dispatcher calls them in a thread.

The folder and the file follow the run folder's rules (:mod:`rankwatch.runfolder`): made
0700, refused when another user owns or may write to it (a sticky folder such as /tmp is
allowed: nobody else can rename or remove our file there), no link followed, and the read at
start is capped: a spool grown (or swapped) to 2 GiB costs at most ``max_bytes`` of memory,
its newest entries kept.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankwatch import runfolder

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


def spool_path(spool_dir: str | Path, run: str, rank: int | None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run) or "default"
    return Path(spool_dir) / f"{safe}.rank-{'none' if rank is None else rank}.jsonl"


READ_SLACK = 64 << 10  # the read at start takes this much more than max_bytes (one long line)


class Spool:
    def __init__(
        self, path: Path, max_bytes: int, *, group: int | None = None, errors: dict[str, int] | None = None
    ) -> None:
        self.path = Path(os.path.abspath(path))
        self.max_bytes = max(0, int(max_bytes))
        self.folder = runfolder.RunFolder(self.path.parent, group=group, errors=errors, sticky_ok=True)
        self._lock = threading.Lock()

    def load(self) -> list[SpoolEntry]:
        with self._lock:
            return self._read()

    def append(self, entries: list[SpoolEntry]) -> list[SpoolEntry]:
        """Add entries; returns the oldest entries dropped to stay within ``max_bytes``."""
        if not entries:
            return []
        with self._lock:
            with self.folder.open() as d:
                size = d.append(self.path.name, b"".join(e.line() for e in entries))
            if size <= self.max_bytes:
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
        cap = self.max_bytes + READ_SLACK
        try:
            with self.folder.open(create=False) as d:
                size = d.size(self.path.name)
                raw = d.read(self.path.name, cap, tail=True) if size is not None else None
        except FileNotFoundError:
            return []
        if raw is None or size is None:
            return []
        if size > cap:
            log.warning(
                "alert spool %s holds %d bytes, more than its bound: only the newest %d are read",
                self.path,
                size,
                cap,
            )
            raw = raw.partition(b"\n")[2]  # the first line is cut: skip it
        out: list[SpoolEntry] = []
        bad = 0
        for line in raw.splitlines():
            if not line.strip():
                continue
            try:
                d = json.loads(line)
                out.append(SpoolEntry(d["id"], d["sink"], d["alert"], int(d.get("attempts", 0))))
            except (ValueError, KeyError, TypeError, RecursionError):
                bad += 1
        if bad:
            log.warning("alert spool %s: skipped %d unreadable line(s)", self.path, bad)
        return out

    def _rewrite(self, entries: list[SpoolEntry]) -> None:
        with self.folder.open() as d:
            if not entries:
                d.unlink(self.path.name)
                return
            d.write(self.path.name, b"".join(e.line() for e in entries), durable=True)
