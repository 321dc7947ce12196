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

All of it is best effort: a file that does not parse (or carries a value this version does
not know) is ignored, a record older than ``stale_after`` is ignored, and stale files are
removed by whoever reads them (another agent's record only once it is far older, so a slow
writer's fresh record is never lost; markers outlive the records they cover; temp files
of a writer that died mid-write go once they are older than ``stale_after``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

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
    path: Path
    tag: str = ""  # the subject's tag; "" for a record about the rank itself

    @property
    def member(self) -> Member:
        return _member(self.rank, self.tag)


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

    Nothing here raises for what another agent wrote: a file that does not parse, or that
    holds values of the wrong type, is left out. Only the folder itself failing (permissions,
    ENOSPC, a dead mount) raises OSError."""

    MARKER_KEEP = 2.0  # markers are read this many times stale_after (clock skew between nodes)
    DEAD = 4.0  # anyone removes records and markers this many times stale_after old

    def __init__(self, path: Path, run: str, stale_after: float) -> None:
        self.path = Path(path)
        self.run = run
        self.stale_after = stale_after
        self._markers: dict[tuple[str, str], Marker] = {}  # written once under a unique name
        self._lock = threading.Lock()  # a timed-out operation may still run beside the next

    def post(self, records: Iterable[Record]) -> None:
        by_kind: dict[str, list[Record]] = {}
        for rec in records:
            by_kind.setdefault(_kind_dir(rec.kind), []).append(rec)
        for kind, recs in by_kind.items():
            folder = self.path / kind
            folder.mkdir(parents=True, exist_ok=True)
            names: dict[Member, str] = {}
            for rec in recs:
                name = f"r{member_name(rec.id)}-{rec.state}-{stamp(rec.time)}.json"
                names[rec.id] = name
                _write(folder / name, rec.to_json())
            for old in _scan(folder):  # one listing per kind, not one per record
                m = _RECORD_RE.match(old.name)
                # ours: only this agent writes the members of rank r
                if m and (mid := _member(int(m[1]), m[2])) in names and old.name != names[mid]:
                    _unlink(old)

    def present(self, ranks: Iterable[int], node: str, now: float) -> None:
        folder = self.path / "present"
        folder.mkdir(parents=True, exist_ok=True)
        for r in ranks:
            doc = {"v": FORMAT, "run": self.run, "rank": r, "node": node, "time": now}
            _write(folder / f"r{r}.json", doc)

    def mark(self, kind: str, marker: Marker) -> None:
        folder = self.path / _kind_dir(kind)
        folder.mkdir(parents=True, exist_ok=True)
        name = f"sent-{marker.status}-r{marker.by}-{stamp(marker.time)}-{secrets.token_hex(3)}.json"
        _write(folder / name, marker.to_json())

    def claim(self, kind: str, status: str, covers: dict[Member, int]) -> set[Member]:
        """Take these records (member -> us) for one message; returns the members this agent got.
        A record already claimed is another sender's: it is left out of our message."""
        folder = self.path / _kind_dir(kind)
        folder.mkdir(parents=True, exist_ok=True)
        got: set[Member] = set()
        for m, us in sorted(covers.items(), key=lambda mu: member_order(mu[0])):
            name = folder / f"claim-{status}-r{member_name(m)}-{us}"
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                continue
            os.close(fd)
            got.add(m)
        return got

    def view(self, kind: str, now: float, mine: Iterable[int] = ()) -> View:
        """List one kind; removes stale markers, this agent's stale records (``mine``: its ranks)
        and long-dead ones."""
        own = set(mine)
        kd = _kind_dir(kind)
        records: dict[Member, Entry] = {}
        markers: list[Marker] = []
        fresh_us = stamp(now - self.stale_after)
        keep_us = stamp(now - self.MARKER_KEEP * self.stale_after)
        dead_us = stamp(now - self.DEAD * self.stale_after)
        folder = self.path / kd
        seen: dict[tuple[str, str], Marker] = {}
        claims: dict[tuple[str, Member], int] = {}
        for entry in _scan(folder, temps=now - self.stale_after):
            if m := _CLAIM_RE.match(entry.name):
                us = int(m[4])
                if us < dead_us:
                    _unlink(entry)
                else:
                    ck2 = (m[1], _member(int(m[2]), m[3]))
                    claims[ck2] = max(us, claims.get(ck2, -1))
                continue
            if m := _RECORD_RE.match(entry.name):
                e = Entry(int(m[1]), m[3], int(m[4]), entry, m[2] or "")
                if e.us < fresh_us:
                    if e.rank in own or e.us < dead_us:
                        _unlink(entry)
                elif e.member not in records or e.us > records[e.member].us:  # mid-replace: newest
                    records[e.member] = e
            elif m := _MARKER_RE.match(entry.name):
                us = int(m[2])
                if us < dead_us:
                    _unlink(entry)
                elif us >= keep_us:
                    ck = (kd, entry.name)
                    marker = self._markers.get(ck) or _marker(entry)
                    if marker is not None:
                        seen[ck] = marker
                        markers.append(marker)
        with self._lock:  # parsed markers are kept while their file is listed
            for ck in [ck for ck in self._markers if ck[0] == kd and ck not in seen]:
                del self._markers[ck]
            self._markers.update(seen)
        present = {
            int(m[1])
            for e in _scan(self.path / "present", temps=now - self.stale_after)
            if (m := _PRESENT_RE.match(e.name))
        }
        return View(records, markers, present, claims)

    def load(
        self,
        entries: Iterable[Entry],
        out: dict[Member, Record | None] | None = None,
        stop: threading.Event | None = None,
    ) -> dict[Member, Record | None]:
        """The leader's read of the records it is about to send for, into ``out`` as it goes (a
        caller that stops waiting keeps what was read, and sets ``stop``): member -> the record,
        or None where it is gone, torn, of another run or member, or holds values this agent
        cannot use."""
        out = {} if out is None else out
        for e in entries:
            if stop is not None and stop.is_set():
                break
            doc = _read(e.path)
            try:
                rec = Record.from_json(doc) if doc is not None else None
            except (KeyError, TypeError, ValueError, OverflowError):
                rec = None
            ok = rec is not None and rec.run == self.run and rec.id == e.member and rec.state == e.state
            out[e.member] = rec if ok else None
        return out


def _marker(path: Path) -> Marker | None:
    doc = _read(path)
    if doc is None:
        return None
    status, by, t, covers, subjects = (doc.get(k) for k in ("status", "by", "time", "covers", "subjects"))
    if (
        status not in ("firing", "resolved")
        or not _is_int(by)
        or not _is_time(t)
        or not isinstance(covers, dict)
    ):
        return None
    try:
        cov: dict[Member, int] = {int(r): t for r, t in covers.items() if _is_int(t)}
    except (TypeError, ValueError):
        return None
    if isinstance(subjects, dict):
        for name, us in subjects.items():
            if isinstance(name, str) and (m := _SUBJECT_KEY_RE.match(name)) and _is_int(us):
                cov[(int(m[1]), m[2])] = us
    return Marker(status, by, float(t), cov)


def _scan(folder: Path, temps: float | None = None) -> list[Path]:
    """The folder's files; with ``temps`` (wall clock), temp files not changed since are removed
    (a writer that died between its write and its rename leaves one behind)."""
    try:
        entries = list(folder.iterdir())
    except FileNotFoundError:
        return []
    if temps is not None:
        for e in entries:
            if _TEMP_RE.match(e.name):
                try:
                    old = e.stat().st_mtime < temps
                except OSError:
                    continue
                if old:
                    _unlink(e)
    return [e for e in entries if not e.name.startswith(".")]


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None  # gone meanwhile, torn by a writer that crashed before its rename, or hostile
    return doc if isinstance(doc, dict) else None


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass  # another agent cleaned it first


def _write(path: Path, doc: dict[str, Any]) -> None:
    """tmp + rename: a reader on another node sees the old file or the new one, never half."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, allow_nan=False, default=str, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
