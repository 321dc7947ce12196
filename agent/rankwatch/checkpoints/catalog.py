"""What is known about every checkpoint of the run: complete or not, intact or not, clean or not.

The catalog is fed scans (``layouts.scan``) and decides when a checkpoint is done: its
files stopped changing for ``settle`` seconds and the framework's marker exists. Only
then is it verified, once, unless its files change again. Verification runs outside the
lock so a reader (the agent's event loop asking for ``last_good``) never waits on disk.

"Good" means intact *and* saved before the run was poisoned: the first NaN/divergence
finding (``mark_bad_from``) or a NaN in a checkpoint's own ``trainer_state.json``.

What it finds wrong it hands on as checkpoint events (``rankwatch.events``); the checkpoint
rules word them as findings. A problem clears when its cause does: a failed or suspect save
once a newer sound one exists (or it is gone or re-verified), a pointer once it leads
somewhere, weights-only once the newest checkpoint is resumable. "Sound" includes intact
saves made after a NaN: the save path works again, and the NaN has its own finding.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rankwatch import events as ev
from rankwatch.checkpoints import layouts as L
from rankwatch.checkpoints.verify import Verdict, hash_files, verify_candidate
from rankwatch.config.schema import CheckpointConfig
from rankwatch.records import EvalRecord, StepRecord

log = logging.getLogger("rankwatch.checkpoints")

WRITING = "writing"
GOOD = "good"
CORRUPT = "corrupt"
INCOMPLETE = "incomplete"
SUSPECT = "suspect"
DELETED = "deleted"
STATUSES = (GOOD, SUSPECT, CORRUPT, INCOMPLETE, WRITING, DELETED)
_JUDGED = (GOOD, SUSPECT, CORRUPT, INCOMPLETE)
_KEEP_DELETED = 256
_MAX_HISTORY = 4096  # trainer_state records handed out at once: what a rank's windows hold


@dataclass(slots=True)
class BadMark:
    step: int | None
    kind: str
    time: float | None
    source: str


@dataclass(slots=True)
class Entry:
    name: str
    path: Path
    layout: str
    step: int | None
    files: dict[str, L.FileStat]
    sig: frozenset[tuple[str, int, float]]
    first_seen: float  # clock
    last_change: float  # clock
    observed: bool  # its writing was watched (not found finished at start-up)
    staging: bool = False
    is_dir: bool = True
    marker: bool | None = None
    marker_name: str | None = None
    status: str = WRITING
    reason: str | None = None
    notes: list[str] = field(default_factory=list)
    intact: bool = False
    resumable: bool | None = None
    weights_only: bool = False
    save_duration: float | None = None
    removing: bool = False
    failed_sig: frozenset[tuple[str, int, float]] | None = None
    hashes: dict[str, str] | None = None
    hashed_at: float | None = None

    @property
    def size(self) -> int:
        return sum(max(0, s.size) for s in self.files.values())

    @property
    def saved_at(self) -> float:
        return max((s.mtime for s in self.files.values()), default=0.0)

    @property
    def judged(self) -> bool:
        return self.status in _JUDGED

    def status_text(self) -> str:
        return f"{self.status}: {self.reason}" if self.reason else self.status

    def saved(self) -> ev.SavedCheckpoint:
        """A copy for the rules: the entry changes under the scan thread."""
        return ev.SavedCheckpoint(
            self.name, self.path, self.step, self.saved_at, self.layout, self.size, self.weights_only
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "layout": self.layout,
            "step": self.step,
            "time": self.saved_at or None,
            "size_bytes": self.size,
            "status": self.status,
            "reason": self.reason,
            "notes": list(self.notes),
            "resumable": self.resumable,
            "save_duration_s": self.save_duration,
        }


# One cause of a problem still open: ("saved", name) a save that failed or is suspect,
# ("changed", name) a verified file altered later, ("pointer", file, value) a "latest"
# pointer leading nowhere, ("weights",) the newest checkpoint holds weights only.
Cause = tuple[str, ...]
Found = list[ev.CheckpointEvent]  # what a scan found wrong or cleared, in order


def cause_text(cause: Cause) -> str:
    if cause[0] == "pointer":
        return f"{cause[1]} -> {cause[2]!r}"
    if cause[0] == "weights":
        return "weights-only saves"
    return cause[1]


class OpenProblems:
    """Which problems are still open, and for what, so each group clears once.

    A group with two causes (a corrupt save and a broken ``latest``) clears only when the
    last of them does. A cause that cleared and comes back opens again.
    """

    def __init__(self) -> None:
        self.causes: dict[ev.CheckpointGroup, dict[Cause, None]] = {}  # in the order they opened

    def open(self, group: ev.CheckpointGroup, cause: Cause) -> bool:
        """Note a cause; False when it was already open (say it once)."""
        mine = self.causes.setdefault(group, {})
        new = cause not in mine
        mine[cause] = None
        return new

    def is_open(self, group: ev.CheckpointGroup, cause: Cause) -> bool:
        return cause in self.causes.get(group, {})

    def settle(self, holds: Callable[[Cause], bool]) -> list[tuple[ev.CheckpointGroup, list[Cause]]]:
        """Forget causes that no longer hold; per group left with none: (group, cleared)."""
        out: list[tuple[ev.CheckpointGroup, list[Cause]]] = []
        for group, mine in list(self.causes.items()):
            gone = [c for c in mine if not holds(c)]
            if not gone:
                continue
            for c in gone:
                del mine[c]
            if not mine:
                del self.causes[group]
                out.append((group, gone))
        return out


def _adopt(e: Entry, c: L.Candidate) -> None:
    e.path, e.layout, e.files, e.sig = c.path, c.layout, dict(c.files), c.signature()
    e.staging, e.marker, e.marker_name, e.is_dir = c.staging, c.marker, c.marker_name, c.is_dir
    if c.step is not None or e.step is None:
        e.step = c.step


class Catalog:
    def __init__(
        self,
        root: Path | str,
        cfg: CheckpointConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        oneshot: bool = False,
        writers: Callable[[Path], bool] | None = None,
    ) -> None:
        self.root = Path(root)
        # Is a file of this save still open for writing by a process (a writer hung inside
        # torch.save)? Then a failing check is a save in progress, not a corrupt file.
        self.writers = writers
        self.cfg = cfg or CheckpointConfig()
        self.clock = clock
        self.wall = wall
        self.oneshot = oneshot  # the CLI: judge what is on disk now, no waiting for writers
        self.entries: dict[str, Entry] = {}
        self.deleted: deque[Entry] = deque(maxlen=_KEEP_DELETED)
        self.save_times: deque[float] = deque(maxlen=64)
        self.bad: BadMark | None = None
        self.pointers: list[L.Pointer] = []
        self.lock = threading.RLock()
        self.updates = 0
        self._seen_root = False
        self._broken_pointers: dict[tuple[str, str], float] = {}
        self.firing = OpenProblems()
        self._history: dict[tuple[bool, int], StepRecord | EvalRecord] = {}
        self._history_step: int | None = None
        self._manifest: dict[str, dict[str, Any]] = self._load_manifest()

    # --- reading -----------------------------------------------------------------

    def ordered(self, *, deleted: bool = False) -> list[Entry]:
        """Oldest to newest: by step where every checkpoint has one, else by save time."""
        with self.lock:
            items = list(self.entries.values()) + (list(self.deleted) if deleted else [])
        if items and all(e.step is not None for e in items):
            return sorted(items, key=lambda e: (e.step, e.saved_at, e.name))
        return sorted(items, key=lambda e: (e.saved_at, e.step or 0, e.name))

    def last_good(self) -> Entry | None:
        return next((e for e in reversed(self.ordered()) if e.status == GOOD), None)

    def _corrupt(self, e: Entry, problem: str, check: str, file: str | None = None) -> ev.CheckpointCorrupt:
        good = self._last_good_saved()
        return ev.CheckpointCorrupt(self.wall(), str(self.root), e.saved(), problem, check, good, file)

    def _last_good_saved(self) -> ev.SavedCheckpoint | None:
        good = self.last_good()
        return good.saved() if good is not None else None

    def newest_judged(self) -> Entry | None:
        return next((e for e in reversed(self.ordered()) if e.judged), None)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        with self.lock:
            for e in self.entries.values():
                out[e.status] += 1
            out[DELETED] += len(self.deleted)
        return out

    def pending(self) -> bool:
        with self.lock:
            return any(e.status == WRITING for e in self.entries.values())

    def writing(self) -> bool:
        """A save looks in progress: something unjudged changed within ``incomplete_after``."""
        return self.write_age() is not None

    def write_age(self) -> float | None:
        """Seconds since the last byte of an unjudged save changed (None: no save in progress).
        The stall detector counts the write itself as progress, not the save being open: a
        writer hung inside ``torch.save`` writes nothing more."""
        now = self.clock()
        limit = float(self.cfg.incomplete_after)
        with self.lock:
            ages = [
                now - e.last_change
                for e in self.entries.values()
                if e.status == WRITING and not e.removing and now - e.last_change < limit
            ]
        return max(0.0, min(ages)) if ages else None

    def next_size(self) -> int | None:
        """What the next save will need: the larger of the last two complete checkpoints."""
        done = [e for e in self.ordered() if e.judged and e.status != INCOMPLETE]
        sizes = [e.size for e in done[-2:]]
        return max(sizes) if sizes else None

    # --- poisoning -----------------------------------------------------------------

    def mark_bad_from(
        self, step: int | None, kind: str, *, time: float | None = None, source: str = "finding"
    ) -> list[Entry]:
        """The run was poisoned at ``step``: checkpoints saved at or after it are suspect."""
        with self.lock:
            old = self.bad
            if step is None and time is None:
                return []
            if old is not None:
                earlier = (step is not None and (old.step is None or step < old.step)) or (
                    step is None and old.step is None and time is not None and (old.time or 0) > time
                )
                if not earlier:
                    return []
            self.bad = BadMark(step, kind, time, source)
            changed = [e for e in self.entries.values() if e.status == GOOD and self._poisoned(e)]
            for e in changed:
                self._suspect(e)
        if changed:
            log.info("checkpoints saved after %s: %s", self._bad_text(), ", ".join(e.name for e in changed))
        return changed

    def _poisoned(self, e: Entry) -> bool:
        b = self.bad
        if b is None:
            return False
        if b.step is not None and e.step is not None:
            return e.step >= b.step
        return b.time is not None and e.saved_at >= b.time

    def _bad_text(self) -> str:
        b = self.bad
        assert b is not None
        where = f"step {b.step}" if b.step is not None else "a poisoned step"
        src = " (trainer_state.json log_history)" if b.source == "trainer_state" else ""
        return f"{b.kind} at {where}{src}"

    def _suspect(self, e: Entry) -> None:
        e.status = SUSPECT
        e.reason = f"saved after {self._bad_text()}"

    # --- updating ----------------------------------------------------------------

    def update(self, scan: L.ScanResult) -> list[ev.CheckpointEvent]:
        """Fold one scan in; verify what just completed. Returns what it found wrong or cleared."""
        found: Found = []
        with self.lock:
            initial = scan.exists and not self._seen_root
            self._seen_root = self._seen_root or scan.exists
            self.updates += 1
            todo = self._reconcile(scan, initial, found)
        results: list[tuple[Entry, L.Candidate, Verdict | None, str | None]] = []
        still_open: set[str] = set()
        for e, c in todo:
            try:
                v = verify_candidate(c, deep=self.cfg.deep)
                results.append((e, c, v, None))
            except FileNotFoundError:
                continue  # changed under us: the next scan sees it
            except OSError as exc:
                v = None
                results.append((e, c, None, f"unreadable ({exc.strerror or exc})"))
            if (v is None or not v.ok) and not self.oneshot and self._open_for_writing(c.path):
                still_open.add(e.name)
        rehash = self._due_rehash()
        rehashed = [(e, self._safe_hash(e)) for e in rehash]
        with self.lock:
            for e, c, verdict, error in results:
                if self.entries.get(e.name) is e and e.sig == c.signature():
                    if e.name in still_open:
                        e.failed_sig = e.sig  # its writer still holds it open: not judged yet
                        continue
                    self._apply(e, verdict, error, found)
                    if verdict is not None:
                        self._gather(verdict.history)
            for e, hashes in rehashed:
                self._compare_hashes(e, hashes, found)
            found.extend(self._pointer_problems(scan))
            found.extend(self._settle())
        if any(v is not None and v.hashes for _, _, v, _ in results) or rehashed:
            self._save_manifest()
        return found

    def _reconcile(self, scan: L.ScanResult, initial: bool, found: Found) -> list[tuple[Entry, L.Candidate]]:
        now, wall = self.clock(), self.wall()
        seen: dict[str, L.Candidate] = {}
        for c in scan.candidates:
            seen[c.name] = c
            e = self.entries.get(c.name)
            if e is None:
                # an empty folder has no mtime to go by: live, it is a save just beginning
                found_done = self.oneshot or (initial and bool(c.files))
                quiet = max(0.0, wall - c.saved_at) if found_done else 0.0
                e = Entry(
                    name=c.name,
                    path=c.path,
                    layout=c.layout,
                    step=c.step,
                    files={},
                    sig=frozenset(),
                    first_seen=now,
                    last_change=now - quiet,
                    observed=not found_done,
                )
                _adopt(e, c)
                self.entries[c.name] = e
            elif c.signature() != e.sig:
                old = e.files
                shrinking = set(c.files) < set(old) and all(old[k] == v for k, v in c.files.items())
                if e.judged:
                    e.removing = shrinking
                    e.observed = True
                    e.first_seen = now
                    e.status, e.reason, e.notes, e.intact = WRITING, None, [], False
                _adopt(e, c)
                e.last_change = now
            else:
                e.marker, e.marker_name = c.marker, c.marker_name
        if scan.exists:
            for name in [n for n in self.entries if n not in seen]:
                self._deleted(self.entries.pop(name))
        self.pointers = list(scan.pointers)
        return self._due(now, found)

    def _open_for_writing(self, path: Path) -> bool:
        if self.writers is None:
            return False
        try:
            return self.writers(path)
        except Exception:
            log.debug("cannot tell whether %s is open for writing", path, exc_info=True)
            return False

    def _deleted(self, e: Entry) -> None:
        if e.staging:
            return  # tmp-checkpoint-N renamed into place
        was = e.status
        e.status = DELETED
        e.reason = "deleted before it completed" if was == WRITING else f"deleted (was {was})"
        self.deleted.append(e)
        log.info("checkpoint %s deleted (%s)", e.name, was)

    def _due(self, now: float, found: Found) -> list[tuple[Entry, L.Candidate]]:
        settle = float(self.cfg.settle)
        give_up = settle if self.oneshot else float(self.cfg.incomplete_after)
        todo: list[tuple[Entry, L.Candidate]] = []
        for e in list(self.entries.values()):
            if e.status != WRITING:
                continue
            quiet = now - e.last_change
            # Found finished (the CLI, or the agent's first scan) with its framework's completion
            # marker: judged by content now. A folder just copied or rsynced has every file new,
            # and waiting for it to "settle" would call every good save "writing".
            if quiet < settle and not (e.marker is True and not e.observed):
                continue
            if e.staging or e.marker is False or (e.removing and quiet < give_up):
                if quiet >= give_up:
                    self._incomplete(e, quiet, found)
                continue
            if e.marker is None and e.failed_sig == e.sig and quiet < self._markerless_give_up():
                continue
            todo.append((e, self._candidate(e)))
        return todo

    def _markerless_give_up(self) -> float:
        """How long a save that fails its check but has no marker to wait for may still be
        being written: ``corrupt_after``, not the quarter hour a missing marker gets."""
        settle = float(self.cfg.settle)
        return settle if self.oneshot else max(settle, float(self.cfg.corrupt_after))

    @staticmethod
    def _candidate(e: Entry) -> L.Candidate:
        return L.Candidate(
            name=e.name,
            path=e.path,
            layout=e.layout,
            step=e.step,
            is_dir=e.is_dir,
            files=dict(e.files),
            marker=e.marker,
            marker_name=e.marker_name,
            staging=e.staging,
        )

    def _incomplete(self, e: Entry, quiet: float, found: Found) -> None:
        e.status = INCOMPLETE
        what = f"no {e.marker_name}" if e.marker is False and e.marker_name else "files stopped changing"
        if e.removing:
            what = "files disappeared"
        e.reason = f"{what} ({ev.duration(quiet)} since the last write)"
        self.firing.open("incomplete", ("saved", e.name))
        found.append(
            ev.CheckpointIncomplete(
                wall=self.wall(),
                root=str(self.root),
                checkpoint=e.saved(),
                marker=e.marker_name if e.marker is False else None,
                quiet_s=quiet,
                last_good=self._last_good_saved(),
            )
        )

    def _apply(self, e: Entry, v: Verdict | None, error: str | None, found: Found) -> None:
        now, wall = self.clock(), self.wall()
        quiet = now - e.last_change
        problem = v.first_problem if v is not None else None
        if v is None or not v.ok:
            if e.marker is None and quiet < self._markerless_give_up():
                e.failed_sig = e.sig  # a markerless save may still be writing: give it time
                return
            text = error or str(problem)
            check = problem.check if problem is not None else "read"
            e.status, e.reason, e.intact = CORRUPT, text, False
            found.append(self._corrupt(e, text, check))
            self.firing.open("corrupt", ("saved", e.name))
            return
        e.intact, e.resumable, e.weights_only = True, v.resumable, v.weights_only
        e.notes = [str(p) for p in v.problems] + list(v.notes)
        if e.step is None and v.content_step is not None:
            e.step = v.content_step
        e.save_duration = (
            max(0.0, e.last_change - e.first_seen) if e.observed else max(0.0, e.saved_at - _first(e))
        )
        self.save_times.append(e.saved_at)
        prev = self._previous_intact(e)
        e.status, e.reason = GOOD, None
        if v.hashes is not None:
            self._record_hashes(e, v.hashes, found)
            if e.status == CORRUPT:
                return
        if v.bad is not None:
            self.mark_bad_from(v.bad[0], f"NaN ({v.bad[1]})", source="trainer_state")
        if self._poisoned(e):
            self._suspect(e)
        elif prev is not None and self._too_small(e, prev):
            e.status = SUSPECT
            small, before = ev.human_size(e.size), ev.human_size(prev.size)
            e.reason = f"suspiciously small: {small} vs {before} ({prev.name})"
            found.append(ev.CheckpointSmall(wall, str(self.root), e.saved(), previous=prev.saved()))
            self.firing.open("suspect", ("saved", e.name))
        if e.weights_only:
            e.notes.append("weights-only: resume will restart Adam")
            regressed = prev is not None and prev.resumable is True
            if self.firing.open("weights_only", ("weights",)):
                found.append(
                    ev.CheckpointWeightsOnly(
                        wall=wall, root=str(self.root), checkpoint=e.saved(), regressed=regressed
                    )
                )

    def _too_small(self, e: Entry, prev: Entry) -> bool:
        if prev.size <= 0 or e.size >= self.cfg.min_size_ratio * prev.size:
            return False
        return not (e.weights_only and prev.resumable)  # the optimizer state explains it

    def _previous_intact(self, e: Entry) -> Entry | None:
        before = None
        for other in self.ordered(deleted=True):
            if other is e:
                return before
            if other.intact and other.layout == e.layout:
                before = other
        return before

    # --- pointers ------------------------------------------------------------------

    def _pointer_problems(self, scan: L.ScanResult) -> list[ev.CheckpointEvent]:
        now, wall = self.clock(), self.wall()
        out: list[ev.CheckpointEvent] = []
        broken = {(p.file, p.value): p for p in scan.pointers if not p.exists}
        for key in list(self._broken_pointers):
            if key not in broken:
                del self._broken_pointers[key]
        for key, p in broken.items():
            since = self._broken_pointers.setdefault(key, now - max(0.0, wall - p.mtime))
            cause = ("pointer", *key)
            if self.firing.is_open("corrupt", cause):
                continue
            if now - since < float(self.cfg.settle) and not self.oneshot:
                continue
            self.firing.open("corrupt", cause)
            out.append(
                ev.CheckpointPointerBroken(
                    wall=wall,
                    root=str(self.root),
                    file=p.file,
                    value=p.value,
                    target=str(p.target),
                    step=p.step,
                )
            )
        return out

    def broken_pointers(self) -> list[L.Pointer]:
        return [p for p in self.pointers if not p.exists]

    # --- resolving -------------------------------------------------------------------

    def _sound(self, e: Entry) -> bool:
        """Intact and not suspiciously small: proof the save path works (NaN or not)."""
        return e.status == GOOD or (e.status == SUSPECT and e.intact and self._poisoned(e))

    def _holds(self, cause: Cause) -> bool:
        what = cause[0]
        if what == "pointer":
            return (cause[1], cause[2]) in self._broken_pointers
        if what == "weights":
            newest = next((e for e in reversed(self.ordered()) if e.intact), None)
            return newest is not None and newest.weights_only
        e = self.entries.get(cause[1])
        if e is None:
            return False  # deleted
        if what == "changed":
            return not e.intact  # until rewritten and verified again
        if self._sound(e):
            return False
        later = self.ordered()
        return not any(self._sound(o) for o in later[later.index(e) + 1 :])

    def _settle(self) -> list[ev.CheckpointEvent]:
        good, wall = self._last_good_saved(), self.wall()
        return [
            ev.CheckpointCleared(
                wall=wall,
                root=str(self.root),
                group=group,
                causes=tuple(cause_text(c) for c in cleared),
                last_good=good,
            )
            for group, cleared in self.firing.settle(self._holds)
        ]

    # --- trainer_state.json history -------------------------------------------------------

    def _gather(self, records: list[StepRecord | EvalRecord]) -> None:
        fed = self._history_step
        for r in records:
            if r.step is not None and (fed is None or r.step > fed):
                self._history.setdefault((isinstance(r, EvalRecord), r.step), r)

    def new_history(self) -> list[StepRecord | EvalRecord]:
        """log_history records newer than any handed out before, oldest first, each handed out once.

        Every checkpoint repeats the whole history: only its new tail is news to a detector.
        """
        with self.lock:
            keys = sorted(self._history, key=lambda k: (k[1], k[0]))[-_MAX_HISTORY:]
            out = [self._history[k] for k in keys]
            self._history.clear()
            if keys:
                self._history_step = keys[-1][1]  # every gathered step was above the old mark
        return out

    # --- deep mode: sha256 manifest -----------------------------------------------------

    def _load_manifest(self) -> dict[str, dict[str, Any]]:
        path = self.cfg.manifest
        if not (self.cfg.deep and path and os.path.exists(path)):
            return {}
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            return dict(doc.get("checkpoints") or {})
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("checkpoint manifest %s unreadable, starting afresh: %s", path, exc)
            return {}

    def _save_manifest(self) -> None:
        path = self.cfg.manifest
        if not (self.cfg.deep and path):
            return
        with self.lock:
            doc = {"version": 1, "root": str(self.root), "checkpoints": dict(self._manifest)}
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("cannot write checkpoint manifest %s: %s", path, exc)

    def _record_hashes(self, e: Entry, hashes: dict[str, str], found: Found) -> None:
        known = self._manifest.get(e.name, {}).get("files", {})
        for rel, digest in hashes.items():
            old = known.get(rel)
            st = e.files.get(rel)
            same_stat = old and st and old.get("size") == st.size and old.get("mtime") == st.mtime
            if same_stat and old.get("sha256") != digest:
                self._changed(e, rel, found)
                return
        e.hashes, e.hashed_at = hashes, self.clock()
        self._manifest[e.name] = {
            "files": {
                rel: {"sha256": d, "size": e.files[rel].size, "mtime": e.files[rel].mtime}
                for rel, d in hashes.items()
                if rel in e.files
            },
            "verified_at": self.wall(),
        }

    def _changed(self, e: Entry, rel: str, found: Found) -> None:
        e.status, e.intact = CORRUPT, False
        e.reason = problem = f"{rel}: changed on disk after it was verified (sha256 differs)"
        self.firing.open("corrupt", ("changed", e.name))
        found.append(self._corrupt(e, problem, "sha256", rel))

    def _due_rehash(self) -> list[Entry]:
        if not self.cfg.deep or self.oneshot:
            return []
        now, every = self.clock(), float(self.cfg.rehash_interval)
        with self.lock:
            return [
                e
                for e in self.entries.values()
                if e.intact
                and e.hashes is not None
                and e.hashed_at is not None
                and now - e.hashed_at >= every
            ]

    def _safe_hash(self, e: Entry) -> dict[str, str] | None:
        try:
            return hash_files(self._candidate(e))
        except OSError:
            return None

    def _compare_hashes(self, e: Entry, hashes: dict[str, str] | None, found: Found) -> None:
        if hashes is None or not e.intact or e.hashes is None:
            return
        for rel, digest in hashes.items():
            if e.hashes.get(rel) not in (None, digest):
                self._changed(e, rel, found)
                return
        e.hashed_at = self.clock()


def _first(e: Entry) -> float:
    return min((s.mtime for s in e.files.values()), default=e.saved_at)
