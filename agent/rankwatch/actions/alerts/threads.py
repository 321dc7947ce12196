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
import re
from collections.abc import Iterable
from pathlib import Path

from rankwatch import runfolder

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

    def __init__(self, path: Path | runfolder.RunFolder) -> None:
        self.folder = path if isinstance(path, runfolder.RunFolder) else runfolder.RunFolder(path)
        self.path = self.folder.path

    def get(self, kind: str, ranks: Iterable[Who], channel: str, now: float) -> str | None:
        try:
            with self.folder.open(create=False) as d:
                for rank in ranks:
                    doc = d.read_json(_name(kind, rank), 4096)
                    if doc is None:
                        continue
                    ts, ch, t = doc.get("ts"), doc.get("channel"), doc.get("time")
                    if (
                        isinstance(ts, str)
                        and len(ts) <= 64
                        and ch == channel
                        and isinstance(t, (int, float))
                        and now - MAX_AGE_S < t <= now + runfolder.CLOCK_SKEW_S
                    ):
                        return ts
        except OSError:
            return None
        return None

    def put(self, kind: str, ranks: Iterable[Who], channel: str, ts: str, now: float) -> None:
        data = json.dumps({"ts": ts, "channel": channel, "time": now}).encode()
        with self.folder.open() as d:
            for rank in ranks:
                d.write(_name(kind, rank), data)

    def drop(self, kind: str, ranks: Iterable[Who]) -> None:
        try:
            with self.folder.open(create=False) as d:
                for rank in ranks:
                    d.unlink(_name(kind, rank))
        except FileNotFoundError:
            return
