"""What this agent's alerts are doing, on disk beside the spool, so a restarted agent (kill -9,
then ``watch``) neither forgets an alert it announced nor announces one twice.

The spool holds messages not yet delivered; this file holds the alerts themselves: each one
firing (announced or not yet) and each one that ended recently (with the step where it
ended, so a replayed log tail can tell an old episode from a new one). One JSON file per
run and rank, replaced whole (temp file, fsync, rename, fsync of the folder): a crash
leaves the old file or the new one. The methods block on disk; the dispatcher runs them on
a daemon thread with a timeout (``offloop``), so a hung mount cannot stall the agent.

What a restarted agent does with it (the rule, also in the dispatcher's docstring):

- An alert that was firing is firing again at start, announced or not as it was; one not
  yet announced (killed inside ``group_wait`` or ``startup_quiet``) is announced now.
- The detectors replay the log's tail at start. Per alert, the tail's last word decides:
  firing means it is the same episode (adopted, not sent again; its resolve goes out when
  the detector sees it clear), resolved means it cleared while no agent ran (its resolve is
  sent now). A firing in the tail that this file does not hold as firing is new unless it
  ended at or after that step (then it is the old episode, already reported): it is sent.
- An inherited alert the restarted agent cannot re-detect (the tail no longer holds it, and
  it does not fire again) stays firing for ``INHERIT_HOLD_S`` (longer than any default
  re-detection: a stall is found again within 420 s + the 600 s checkpoint allowance).
  Then a condition is resolved with a message that says why ("not seen again by the
  restarted agent"); an event (a crash, an OOM: alerts that never resolve by themselves)
  is forgotten without a message, as the agent that announced it would have sent none.
- A file last written longer than ``INHERIT_HOLD_S`` ago is from an earlier incarnation of
  the run (a requeued job, a reused run name): its firing alerts get that same end at once,
  unless the replayed tail shows them firing, so a new NaN of a new job is never taken for
  the old one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rankwatch import runfolder

log = logging.getLogger("rankwatch.alerts.state")

FORMAT = 1
INHERIT_HOLD_S = 1200.0
ENDED_KEEP_S = 7 * 24 * 3600.0  # ended alerts are remembered this long (replay comparisons)
ENDED_MAX = 1000
MAX_BYTES = 8 << 20  # a file larger than this is not ours to parse
# Findings of these kinds are events, not conditions: no detector ever resolves them.
EVENT_KINDS = frozenset(
    {"crash", "oom", "cuda_error", "xid", "nccl_timeout", "nccl_error", "process_exit", "checkpoint_corrupt"}
)


@dataclass
class Remembered:
    rank: int | None
    kind: str
    severity: str
    since: float  # wall clock of the episode (its board record's time)
    sent: bool = False  # announced (queued to the sinks, spooled, or sent by a peer)
    step: int | None = None  # the finding's step
    member: dict[str, Any] = field(default_factory=dict)  # message, step, evidence, dump_path, starts_at
    ended: float | None = None  # wall clock of its resolve (None: firing)
    ended_step: int | None = None
    resolve_pending: bool = False  # ended, its resolve not yet announced
    subject: str | None = None  # Finding.subject (a GPU's UUID): part of the alert's identity
    alert_id: str | None = None  # the id its firing went out with: its resolve carries it too

    @classmethod
    def from_json(cls, d: Any) -> Remembered | None:
        if not isinstance(d, dict):
            return None
        rank, kind, sev, since = d.get("rank"), d.get("kind"), d.get("severity"), d.get("since")
        if not (rank is None or _is_int(rank)) or not isinstance(kind, str) or not isinstance(sev, str):
            return None
        if not _is_num(since):
            return None
        ended, step, ended_step = d.get("ended"), d.get("step"), d.get("ended_step")
        member = d.get("member")
        subject = d.get("subject")
        alert_id = d.get("alert_id")
        return cls(
            rank,
            kind,
            sev,
            float(since),  # type: ignore[arg-type]  # _is_num checked it
            bool(d.get("sent")),
            step if _is_int(step) else None,
            member if isinstance(member, dict) else {},
            float(ended) if _is_num(ended) else None,  # type: ignore[arg-type]
            ended_step if _is_int(ended_step) else None,
            bool(d.get("resolve_pending")),
            subject if isinstance(subject, str) else None,
            alert_id if isinstance(alert_id, str) and 0 < len(alert_id) <= 64 else None,
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def state_path(spool_dir: str | Path, run: str, rank: int | None) -> Path:
    """Beside the spool file of the same run and rank (``<run>.rank-<r>.state.json``)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run) or "default"
    return Path(spool_dir) / f"{safe}.rank-{'none' if rank is None else rank}.state.json"


class StateFile:
    """The state file, through the run folder's rules (:mod:`rankwatch.runfolder`): a symlink
    planted at its name or its temp name is never followed, another user's file never read,
    and the read is capped at ``MAX_BYTES``."""

    def __init__(self, path: Path, *, group: int | None = None, errors: dict[str, int] | None = None) -> None:
        self.path = Path(os.path.abspath(path))
        self.folder = runfolder.RunFolder(self.path.parent, group=group, errors=errors, sticky_ok=True)
        self.saved_at: float | None = None  # wall clock of the last save, as ``load`` read it
        self._lock = threading.Lock()  # a timed-out write may still run beside the next

    def load(self) -> list[Remembered]:
        """The alerts remembered; [] when there is no file. A file that does not parse is set
        aside (renamed ``.bad``) and logged: the agent starts as if it were the first time."""
        name = self.path.name
        with self._lock:
            try:
                with self.folder.open(create=False) as d:
                    size = d.size(name)
                    if size is None:
                        if d.mtime(name) is None:
                            return []
                        raise ValueError("not a regular file of this agent's user")
                    if size > MAX_BYTES:
                        raise ValueError("too large")
                    data = d.read(name, MAX_BYTES)
                    if data is None:
                        return []
                    doc = json.loads(data)
                    if not isinstance(doc, dict) or not isinstance(doc.get("alerts"), list):
                        raise ValueError("not an alert state document")
            except FileNotFoundError:
                return []
            except (OSError, ValueError, RecursionError) as e:
                log.warning("alert state %s unreadable (%s); set aside, starting afresh", self.path, e)
                try:
                    with self.folder.open(create=False) as d:
                        d.rename(name, name + ".bad")
                except OSError:
                    pass
                return []
            saved = doc.get("saved")
            self.saved_at = float(saved) if _is_num(saved) else None  # type: ignore[arg-type]
            return [r for r in map(Remembered.from_json, doc["alerts"]) if r is not None]

    def save(self, alerts: list[Remembered], meta: dict[str, Any]) -> None:
        doc = {"v": FORMAT, **meta, "alerts": [asdict(a) for a in alerts]}
        data = json.dumps(doc, separators=(",", ":"), default=str, allow_nan=False).encode()
        with self._lock, self.folder.open() as d:
            d.write(self.path.name, data, durable=True)


def prune_ended(ended: dict[Any, Remembered], now: float) -> None:
    """Ended alerts are kept for a week, and at most ``ENDED_MAX`` of them (newest)."""
    for k in [k for k, r in ended.items() if r.ended is not None and now - r.ended > ENDED_KEEP_S]:
        del ended[k]
    if len(ended) > ENDED_MAX:
        for k, _ in sorted(ended.items(), key=lambda kr: kr[1].ended or 0.0)[: len(ended) - ENDED_MAX]:
            del ended[k]
