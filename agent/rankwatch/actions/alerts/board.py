"""The alert board: a shared folder where the agents of one run agree who sends a grouped alert.

Why a folder: the recommended Slurm setup runs one agent per rank, so a job-wide stall is
seen by eight dispatchers that each group only what they see, and eight messages go out.
The agents of a run already share a filesystem for their stack dumps (one incident folder
per hang); small files written atomically beside them let the agents elect one sender with
no network protocol, no server and no extra port. The lowest rank with a fresh record that
no sender has covered yet sends for all of them and leaves a marker naming what it covered.

The unit of coordination is a MEMBER: a rank, or a rank and a subject (``Finding.subject``:
one of its GPUs, a folder). Eight agents whose GPUs overheat with one node's cooling post
eight members and send one message; two hot GPUs of one rank are two members, so the first
to cool resolves only its own. In code a member is the rank itself (``int``) when the alert
has no subject, else ``(rank, tag)``; ``tag`` is ``subject_tag(subject)``, 16 hex digits of
the subject's SHA-256: safe in a file name whatever the subject holds, bounded, and distinct
for distinct subjects (a collision is likely only near 2**32 subjects of one kind and rank). Members
are ordered by rank, then (a rank's subject members after its plain one) by tag; the full
subject travels inside the record.

Layout (default ``<dumps.dir>/<run>/.alerts/``)::

    present/r<rank>.json                          an agent watches this rank ("7 of 8 ranks")
    <kind>/r<rank>-<state>-<us>.json              that rank's latest state of that kind
    <kind>/r<rank>.<tag>-<state>-<us>.json        ... of that kind about one subject
    <kind>/sent-<status>-r<by>-<us>-<rand>.json   a sender covered these records: "covers"
                                                  (rank -> us), "subjects" ("rank.tag" -> us)
    <kind>/claim-<status>-r<rank>-<us>            one sender took this record (exclusive create)
    <kind>/claim-<status>-r<rank>.<tag>-<us>      ... this subject's record

Files without a subject are byte for byte those of the previous version, so agents of both
versions share a board for subject-less alerts. A subject file (``r3.<tag>-...``, a claim of
one) does not match the previous version's names, so such an agent ignores it (and sends its
own subject alerts alone, as it always did): at worst a duplicate, never a lost alert.

State and time sit in the file names, so deciding who leads costs one directory listing
per agent even with a thousand ranks (a metadata storm on Lustre is what a job-wide stall
must not cause); only the leader reads the records it sends for. ``<us>`` is the wall
clock of the episode in microseconds: it ties a marker to the records it covered.

A sender claims every record it is about to send for with an exclusive create (``O_EXCL``:
atomic on local filesystems, NFSv3+ and Lustre) and sends only those it got, so however
the agents interleave (a slow leader and its taker deciding at the same moment), a record
goes out in one message at most. A claimer killed between its claim and its send loses
those records, like any alert whose first attempt is in flight at a SIGKILL.

The folder and every file in it go through :mod:`rankwatch.runfolder`: made 0700 (0750 with
``dumps.group``) and refused, loudly, when another user owns it or may write to it (the board
is then set aside and each agent sends its own alerts); no link followed, no FIFO opened,
every read capped. A name or record is believed only when its rank lies within the world and
its time is not beyond the clock-skew bound in the future: a claim, marker or record "from
the future" (forged, or a clock far off) is ignored and counted, so it can neither win an
election nor keep an alert from going out.

All of it is best effort: a file that does not parse (or carries a value this version does
not know) is ignored, a record older than ``stale_after`` is ignored, and stale files are
removed by whoever reads them (another agent's record only once it is far older, so a slow
writer's fresh record is never lost; markers outlive the records they cover; temp files
of a writer that died mid-write go once they are older than ``stale_after``).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from rankwatch import runfolder
from rankwatch.dumps.store import sanitise_run
from rankwatch.records import Diagnosis

FORMAT = 1
_RECORD_RE = re.compile(r"^r(\d{1,9})(?:\.([0-9a-f]{16}))?-(firing|resolved|cleared)-(\d{1,20})\.json$")
_MARKER_RE = re.compile(r"^sent-(firing|resolved)-r\d{1,9}-(\d{1,20})-[0-9a-f]+\.json$")
_PRESENT_RE = re.compile(r"^r(\d{1,9})\.json$")
_CLAIM_RE = re.compile(r"^claim-(firing|resolved)-r(\d{1,9})(?:\.([0-9a-f]{16}))?-(\d{1,20})$")
_SUBJECT_KEY_RE = re.compile(r"^(\d{1,9})\.([0-9a-f]{16})$")  # a marker's "subjects" key
_TEMP_RE = re.compile(r"^\..+\.tmp$")
STATES = ("firing", "resolved", "cleared")
SEVERITIES = ("info", "warning", "critical")  # Severity labels; a record with another is ignored
MAX_TEXT = 1000  # per evidence string and message: records stay small on a shared filesystem
MAX_EVIDENCE = 16
TAG_LEN = 16

Member = int | tuple[int, str]  # a rank, or (rank, subject_tag): see the module docstring


def subject_tag(subject: str) -> str:
    """The subject's part of a file name: 16 hex digits of its SHA-256."""
    return hashlib.sha256(subject.encode("utf-8", "surrogatepass")).hexdigest()[:TAG_LEN]


def member_of(rank: int, subject: str | None) -> Member:
    return rank if subject is None else (rank, subject_tag(subject))


def _member(rank: int, tag: str | None) -> Member:
    return rank if not tag else (rank, tag)


def rank_of(m: Member) -> int:
    return m if isinstance(m, int) else m[0]


def member_order(m: Member) -> tuple[int, str]:
    """Lowest rank first; a rank's plain member before its subjects, those by tag."""
    return (m, "") if isinstance(m, int) else m


def member_name(m: Member) -> str:
    """``<rank>`` or ``<rank>.<tag>``: as in file names (after the ``r``) and marker keys."""
    return str(m) if isinstance(m, int) else f"{m[0]}.{m[1]}"


def stamp(t: float) -> int:
    """Wall-clock seconds as the integer microseconds in file names and markers."""
    return round(t * 1e6)


def board_path(board_dir: str | None, dumps_dir: str | os.PathLike[str] | None, run: str) -> Path | None:
    """``<board_dir or dumps_dir>/<run>/.alerts``; ``''`` (or no directory at all) is off."""
    root = board_dir if board_dir is not None else dumps_dir
    if root is None or str(root) == "":
        return None
    return Path(root) / sanitise_run(run) / ".alerts"


def _kind_dir(kind: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "_", kind.lower()).strip("_")[:64] or "kind"


def small_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    """What a peer needs to build the grouped message: scalars and short lists, cut short."""
    out: dict[str, Any] = {}
    for k, v in evidence.items():
        if len(out) >= MAX_EVIDENCE:
            break
        if not isinstance(k, str):
            continue
        if v is None or isinstance(v, (bool, int)) or (isinstance(v, float) and math.isfinite(v)):
            out[k] = v
        elif isinstance(v, str):
            out[k] = v[-MAX_TEXT:]
        elif isinstance(v, list) and all(isinstance(x, str) for x in v):
            out[k] = [x[-200:] for x in v[-10:]]
    return out


@dataclass
class Record:
    run: str
    kind: str
    rank: int
    state: str  # firing | resolved | cleared
    time: float  # wall clock of the episode; a re-post of the same episode keeps it
    node: str
    severity: str
    member: dict[str, Any] = field(default_factory=dict)
    subject: str | None = None  # what within the rank (a GPU's UUID); None: the rank itself

    @property
    def id(self) -> Member:
        return member_of(self.rank, self.subject)

    def to_json(self) -> dict[str, Any]:
        """Without a subject, exactly the previous version's record (agents of both share a board)."""
        doc = {"v": FORMAT, **asdict(self)}
        if self.subject is None:
            del doc["subject"]
        return doc

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Record:
        """A record as another agent (maybe of another version) wrote it; ValueError if it is not
        one this agent can use. Its member part is cleaned rather than refused: a field of an odd
        type is left out, so building the message from it cannot fail."""
        run, kind, state, node, sev = (d.get(k) for k in ("run", "kind", "state", "node", "severity"))
        rank, t = d.get("rank"), d.get("time")
        if not (isinstance(run, str) and isinstance(kind, str) and isinstance(node, (str, type(None)))):
            raise ValueError("run, kind or node is not a string")
        if not _is_int(rank) or rank < 0 or state not in STATES or not _is_time(t):
            raise ValueError("bad rank, state or time")
        if not isinstance(sev, str) or sev.strip().lower() not in SEVERITIES:
            raise ValueError(f"unknown severity {sev!r}")
        subject = d.get("subject")
        if not isinstance(subject, (str, type(None))):
            raise ValueError("subject is not a string")
        return cls(
            run,
            kind,
            rank,
            state,
            float(t),
            node or "",
            sev.strip().lower(),
            clean_member(d.get("member"), t),
            subject,
        )


# A user name as the OS gives it (useradd caps it at 32; LDAP names run longer).
MAX_USER = 256


def clean_member(m: Any, t: float) -> dict[str, Any]:
    """The member fields of a record with the types the message needs (odd ones left out)."""
    m = m if isinstance(m, dict) else {}
    message, step, evidence, dump, starts = (
        m.get(k) for k in ("message", "step", "evidence", "dump_path", "starts_at")
    )
    return {
        "message": message[:MAX_TEXT] if isinstance(message, str) else "",
        "step": step if _is_int(step) else None,
        "evidence": small_evidence(evidence) if isinstance(evidence, dict) else {},
        "dump_path": dump[:MAX_TEXT] if isinstance(dump, str) and dump else None,
        "starts_at": float(starts) if _is_time(starts) else float(t),
        "diagnosis": Diagnosis.from_json(m.get("diagnosis")),
        "user": user[:MAX_USER] if isinstance(user := m.get("user"), str) and user else None,
    }


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1e11


@dataclass
class Entry:
    """A record as its file name tells it: enough to elect a leader without opening it."""

    rank: int
    state: str
    us: int
    path: Path | None = None  # or, cheaper when listing a thousand: kind_dir and name below
    tag: str = ""  # the subject's tag; "" for a record about the rank itself
    kind_dir: str = ""
    name: str = ""

    @property
    def member(self) -> Member:
        return _member(self.rank, self.tag)

    def where(self) -> tuple[str, str]:
        """(kind folder, file name) on the board."""
        if self.path is not None:
            return self.path.parent.name, self.path.name
        return self.kind_dir, self.name


@dataclass
class Marker:
    status: str
    by: int
    time: float
    covers: dict[Member, int]  # member -> record time (us)

    def to_json(self) -> dict[str, Any]:
        """Plain ranks under "covers" as before (an agent of the previous version reads those),
        subject members under "subjects" (which it ignores)."""
        plain = {str(m): t for m, t in self.covers.items() if isinstance(m, int)}
        subj = {member_name(m): t for m, t in self.covers.items() if not isinstance(m, int)}
        doc: dict[str, Any] = {"v": FORMAT, "status": self.status, "by": self.by, "time": self.time}
        doc["covers"] = plain
        if subj:
            doc["subjects"] = subj
        return doc


@dataclass
class View:
    """The board for one kind as one agent read it."""

    records: dict[Member, Entry]  # fresh records, by member
    markers: list[Marker]
    present: set[int]
    claims: dict[tuple[str, Member], int] = field(default_factory=dict)  # (status, member) -> newest us

    def covered(self, member: Member, status: str, since_us: int) -> bool:
        """A sender covered (or claimed, so is sending) this member's record of ``since_us`` or later."""
        if self.claims.get((status, member), -1) >= since_us:
            return True
        return any(m.status == status and m.covers.get(member, -1) >= since_us for m in self.markers)

    def sent(self, member: Member, status: str, since_us: int) -> bool:
        """A sender's marker names this member's record of ``since_us`` or later: it was sent (a
        claim alone is not proof: its claimer may have died before sending)."""
        return any(m.status == status and m.covers.get(member, -1) >= since_us for m in self.markers)

    def open(self, status: str) -> list[Member]:
        """Members in ``status`` that nobody has sent for yet, in ``member_order``."""
        recs = self.records.items()
        return sorted(
            (r for r, e in recs if e.state == status and not self.covered(r, status, e.us)), key=member_order
        )

    def ranks(self) -> set[int]:
        return self.present | {rank_of(m) for m in self.records}


class Board:
    """Blocking file operations; the dispatcher runs them in a thread with a timeout.

    Nothing here raises for what another agent wrote: a file that does not parse, holds values
    of the wrong type, names a rank outside the world or a time beyond the clock-skew bound is
    left out (and counted). Only the folder itself failing (refused, permissions, ENOSPC, a
    dead mount) raises OSError."""

    MARKER_KEEP = 2.0  # markers are read this many times stale_after (clock skew between nodes)
    DEAD = 4.0  # anyone removes records and markers this many times stale_after old

    def __init__(
        self,
        path: Path | runfolder.RunFolder,
        run: str,
        stale_after: float,
        *,
        world: int | None = None,
        skew: float = runfolder.CLOCK_SKEW_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """``world``: ranks at or past it are not believed; ``skew``: how far in the future a
        peer's time may lie (``dumps.clock_skew``); ``wall``: the clock records are dated by."""
        self.folder = path if isinstance(path, runfolder.RunFolder) else runfolder.RunFolder(path)
        self.path = self.folder.path
        self.run = run
        self.stale_after = stale_after
        self.world = world if world is not None and world > 0 else None
        self.skew = skew
        self.wall = wall
        self._markers: dict[tuple[str, str], Marker] = {}  # written once under a unique name
        self._lock = threading.Lock()  # a timed-out operation may still run beside the next

    def _in_world(self, rank: int, what: str) -> bool:
        if self.world is not None and rank >= self.world:
            self.folder.reject(what, f"rank {rank} outside a world of {self.world}")
            return False
        return True

    def post(self, records: Iterable[Record]) -> None:
        by_kind: dict[str, list[Record]] = {}
        for rec in records:
            by_kind.setdefault(_kind_dir(rec.kind), []).append(rec)
        with self.folder.open() as top:
            for kind, recs in by_kind.items():
                folder = top.sub(kind)
                names: dict[Member, str] = {}
                for rec in recs:
                    name = f"r{member_name(rec.id)}-{rec.state}-{stamp(rec.time)}.json"
                    names[rec.id] = name
                    folder.write_json(name, rec.to_json())
                for old in folder.names():  # one listing per kind, not one per record
                    m = _RECORD_RE.match(old)
                    # ours: only this agent writes the members of rank r
                    if m and (mid := _member(int(m[1]), m[2])) in names and old != names[mid]:
                        folder.unlink(old)

    def present(self, ranks: Iterable[int], node: str, now: float) -> None:
        with self.folder.open() as top:
            folder = top.sub("present")
            for r in ranks:
                doc = {"v": FORMAT, "run": self.run, "rank": r, "node": node, "time": now}
                folder.write_json(f"r{r}.json", doc)

    def mark(self, kind: str, marker: Marker) -> None:
        with self.folder.open() as top:
            folder = top.sub(_kind_dir(kind))
            name = f"sent-{marker.status}-r{marker.by}-{stamp(marker.time)}-{secrets.token_hex(3)}.json"
            folder.write_json(name, marker.to_json())

    def claim(self, kind: str, status: str, covers: dict[Member, int]) -> set[Member]:
        """Take these records (member -> us) for one message; returns the members this agent got.
        A record already claimed is another sender's: it is left out of our message."""
        got: set[Member] = set()
        with self.folder.open() as top:
            folder = top.sub(_kind_dir(kind))
            for m, us in sorted(covers.items(), key=lambda mu: member_order(mu[0])):
                name = f"claim-{status}-r{member_name(m)}-{us}"
                if folder.create(name):
                    got.add(m)
                elif not folder.trusted(name, empty=True) and folder.unlink(name) and folder.create(name):
                    got.add(m)  # a link, FIFO or another user's file there is no peer's claim
        return got

    def view(self, kind: str, now: float, mine: Iterable[int] = ()) -> View:
        """List one kind; removes stale markers, this agent's stale records (``mine``: its ranks)
        and long-dead ones. Names of ranks outside the world, or dated beyond the clock-skew
        bound in the future, are ignored (and counted): a forged claim cannot silence an alert."""
        own = set(mine)
        kd = _kind_dir(kind)
        records: dict[Member, Entry] = {}
        markers: list[Marker] = []
        fresh_us = stamp(now - self.stale_after)
        keep_us = stamp(now - self.MARKER_KEEP * self.stale_after)
        dead_us = stamp(now - self.DEAD * self.stale_after)
        future_us = stamp(now + self.skew)
        seen: dict[tuple[str, str], Marker] = {}
        claims: dict[tuple[str, Member], int] = {}
        with self.folder.open() as top:
            folder = top.sub(kd)
            for name in _scan(folder, temps=now - self.stale_after):
                if m := _CLAIM_RE.match(name):
                    us = int(m[4])
                    if us < dead_us:
                        folder.unlink(name)
                    elif us > future_us:
                        self.folder.reject(name, "a claim dated beyond the clock-skew bound")
                    elif self._in_world(int(m[2]), name) and (
                        int(m[2]) not in own or folder.trusted(name, empty=True)
                    ):
                        # A claim on this agent's own record would silence it: that one is
                        # believed only from a regular file of ours (one lstat per own member).
                        ck2 = (m[1], _member(int(m[2]), m[3]))
                        claims[ck2] = max(us, claims.get(ck2, -1))
                    continue
                if m := _RECORD_RE.match(name):
                    e = Entry(int(m[1]), m[3], int(m[4]), None, m[2] or "", kd, name)
                    if e.us < fresh_us:
                        if e.rank in own or e.us < dead_us:
                            folder.unlink(name)
                    elif e.us > future_us:
                        self.folder.reject(name, "a record dated beyond the clock-skew bound")
                    elif not self._in_world(e.rank, name):
                        continue
                    elif e.member not in records or e.us > records[e.member].us:  # mid-replace: newest
                        records[e.member] = e
                elif m := _MARKER_RE.match(name):
                    us = int(m[2])
                    if us < dead_us:
                        folder.unlink(name)
                    elif us > future_us:
                        self.folder.reject(name, "a marker dated beyond the clock-skew bound")
                    elif us >= keep_us:
                        ck = (kd, name)
                        marker = self._markers.get(ck) or self._marker(folder, name, future_us)
                        if marker is not None:
                            seen[ck] = marker
                            markers.append(marker)
            with self._lock:  # parsed markers are kept while their file is listed
                for ck in [ck for ck in self._markers if ck[0] == kd and ck not in seen]:
                    del self._markers[ck]
                self._markers.update(seen)
            present = {
                int(m[1])
                for name in _scan(top.sub("present"), temps=now - self.stale_after)
                if (m := _PRESENT_RE.match(name)) and self._in_world(int(m[1]), name)
            }
        return View(records, markers, present, claims)

    def _marker(self, folder: runfolder.Folder, name: str, future_us: int) -> Marker | None:
        """A marker as another agent wrote it, believed only for ranks within the world and for
        record times not beyond the clock-skew bound."""
        marker = _marker(folder.read_json(name))
        if marker is None:
            return None
        if not self._in_world(marker.by, name):
            return None
        covers = {
            m: us for m, us in marker.covers.items() if us <= future_us and self._in_world(rank_of(m), name)
        }
        return Marker(marker.status, marker.by, marker.time, covers)

    def load(
        self,
        entries: Iterable[Entry],
        out: dict[Member, Record | None] | None = None,
        stop: threading.Event | None = None,
    ) -> dict[Member, Record | None]:
        """The leader's read of the records it is about to send for, into ``out`` as it goes (a
        caller that stops waiting keeps what was read, and sets ``stop``): member -> the record,
        or None where it is gone, torn, of another run, member or world, dated beyond the
        clock-skew bound, or holds values this agent cannot use."""
        out = {} if out is None else out
        with self.folder.open(create=False) as top:
            subs: dict[str, runfolder.Folder] = {}
            for e in entries:
                if stop is not None and stop.is_set():
                    break
                kd, name = e.where()
                try:
                    if kd not in subs:
                        subs[kd] = top.sub(kd, create=False)
                    doc = subs[kd].read_json(name)
                except OSError:
                    doc = None
                try:
                    rec = Record.from_json(doc) if doc is not None else None
                except (KeyError, TypeError, ValueError, OverflowError):
                    rec = None
                ok = rec is not None and rec.run == self.run and rec.id == e.member and rec.state == e.state
                if ok and rec is not None:
                    ok = self._in_world(rec.rank, name) and rec.time <= self.wall() + self.skew
                out[e.member] = rec if ok else None
        return out


def _marker(doc: dict[str, Any] | None) -> Marker | None:
    if doc is None:
        return None
    status, by, t, covers, subjects = (doc.get(k) for k in ("status", "by", "time", "covers", "subjects"))
    if (
        status not in ("firing", "resolved")
        or not _is_int(by)
        or by < 0
        or not _is_time(t)
        or not isinstance(covers, dict)
    ):
        return None
    try:
        cov: dict[Member, int] = {int(r): t for r, t in covers.items() if _is_int(t) and int(r) >= 0}
    except (TypeError, ValueError, OverflowError):
        return None
    if isinstance(subjects, dict):
        for name, us in subjects.items():
            if isinstance(name, str) and (m := _SUBJECT_KEY_RE.match(name)) and _is_int(us):
                cov[(int(m[1]), m[2])] = us
    return Marker(status, by, float(t), cov)


def _scan(folder: runfolder.Folder, temps: float | None = None) -> list[str]:
    """The folder's names; with ``temps`` (wall clock), temp files not changed since are removed
    (a writer that died between its write and its rename leaves one behind)."""
    names = folder.names()
    if temps is not None:
        for name in names:
            if _TEMP_RE.match(name):
                mtime = folder.mtime(name)
                if mtime is not None and mtime < temps:
                    folder.unlink(name)
    return [n for n in names if not n.startswith(".")]
