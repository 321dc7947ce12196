"""Slack thread ids shared by the agents of a run.

A resolve belongs in the thread of its firing. With one agent per rank, the agent that
sends a grouped resolve is often not the one that sent the firing, and it would post the
resolve at the top of the channel. So the
thread of each (kind, rank) is also written next to the alert board, one small file each:
``<board>/slack-threads/<kind>-r<rank>.json`` (``<kind>-r<rank>-<subject>.json`` for an alert
about one GPU of the rank: two GPUs' alerts are two threads). Best effort: a file that cannot be read or
written only costs the threading, never the alert.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path

MAX_AGE_S = 7 * 86400.0  # a thread older than this is not continued (nobody reads it any more)
# A rank, or (rank, subject) for an alert about something within the rank (a GPU's UUID).
Who = int | None | tuple[int | None, str | None]


def _name(kind: str, who: Who) -> str:
    rank, subject = who if isinstance(who, tuple) else (who, None)
    safe = re.sub(r"[^a-z0-9_-]+", "_", kind.lower()).strip("_")[:64] or "kind"
    about = "" if subject is None else "-" + (re.sub(r"[^A-Za-z0-9_-]+", "_", subject)[:80] or "_")
    return f"{safe}-r{rank if rank is not None else 'x'}{about}.json"


class ThreadStore:
    """Blocking file operations; the Slack sink runs them off the event loop with a timeout."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def get(self, kind: str, ranks: Iterable[Who], channel: str, now: float) -> str | None:
        for rank in ranks:
            try:
                doc = json.loads((self.path / _name(kind, rank)).read_bytes())
            except (OSError, ValueError, RecursionError):
                continue
            if not isinstance(doc, dict):
                continue
            ts, ch, t = doc.get("ts"), doc.get("channel"), doc.get("time")
            if isinstance(ts, str) and ch == channel and isinstance(t, (int, float)) and now - t < MAX_AGE_S:
                return ts
        return None

    def put(self, kind: str, ranks: Iterable[Who], channel: str, ts: str, now: float) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"ts": ts, "channel": channel, "time": now}).encode()
        for rank in ranks:
            final = self.path / _name(kind, rank)
            tmp = self.path / f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
            try:
                tmp.write_bytes(data)
                os.replace(tmp, final)
            except OSError:
                tmp.unlink(missing_ok=True)
                raise

    def drop(self, kind: str, ranks: Iterable[Who]) -> None:
        for rank in ranks:
            (self.path / _name(kind, rank)).unlink(missing_ok=True)
