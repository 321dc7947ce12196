"""The on-disk dump layout: ``<root>/<run>/<UTC time>_<reason>/rank-<r>.txt`` (+ ``.json``).

One folder per incident keeps the dumps of all ranks of one hang together, which is
what ``dumps diff`` needs. Writes are atomic so a reader (or a crash mid-write) never
sees half a file, and reading tolerates whatever else lands in the folder.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankwatch.dumps.capture import DumpResult

log = logging.getLogger(__name__)

TIME_FORMAT = "%Y%m%dT%H%M%SZ"
_INCIDENT_RE = re.compile(r"^(\d{8}T\d{6}Z)_([a-z0-9_-]+)$")
_RANK_FILE_RE = re.compile(r"^rank-(\d+)\.(txt|json)$")
DUMP_FORMAT = 1


def _sanitise(text: str, allowed: str, *, lower: bool, default: str) -> str:
    text = text.lower() if lower else text
    text = re.sub(f"[^{allowed}]+", "_", text).strip("_.")
    return text[:80] or default


def sanitise_reason(reason: str) -> str:
    return _sanitise(reason, "a-z0-9_-", lower=True, default="manual")


def sanitise_run(run: str) -> str:
    """A single path component: no separators, no leading dot, so no traversal."""
    return _sanitise(run, "A-Za-z0-9._-", lower=False, default="default")


def incident_name(reason: str, when: datetime) -> str:
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc)
    return f"{when.strftime(TIME_FORMAT)}_{sanitise_reason(reason)}"


@dataclass
class IncidentInfo:
    run: str
    name: str
    reason: str
    time: datetime
    path: Path
    ranks: list[int] = field(default_factory=list)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # os.open rather than mkstemp so the umask, not 0600, decides who may read dumps.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class DumpStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.notes: list[str] = []

    def _note(self, message: str) -> None:
        self.notes.append(message)
        log.warning("dump store: %s", message)

    def run_dir(self, run: str) -> Path:
        return self.root / sanitise_run(run)

    def incident_dir(self, run: str, incident: str) -> Path:
        path = self.run_dir(run) / _sanitise(incident, "A-Za-z0-9_-", lower=False, default="x")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_rank(
        self, run: str, incident: str, rank: int, result: DumpResult, meta: dict[str, Any]
    ) -> Path:
        """Write ``rank-<r>.txt`` and ``rank-<r>.json``; returns the text file's path."""
        folder = self.incident_dir(run, incident)
        captured = result.captured_at.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
        doc = {
            "format": DUMP_FORMAT,
            "rank": rank,
            "pid": result.pid,
            "ok": result.ok,
            "error": result.error,
            "captured_at": captured,
            "duration_s": round(result.duration_s, 4),
            "meta": meta,
            "command": result.command,
            "processes": result.processes,
            "notes": result.notes,
            "text": result.text,
            "threads": result.threads,
        }
        status = "ok" if result.ok else f"FAILED: {result.error}"
        header = f"# rankwatch dump: rank {rank}, pid {result.pid}, captured {captured}, {status}\n"
        notes = "".join(f"# note: {n}\n" for n in result.notes)
        txt = folder / f"rank-{rank}.txt"
        _atomic_write(folder / f"rank-{rank}.json", json.dumps(doc, indent=1, default=str).encode())
        _atomic_write(txt, (header + notes + "\n" + result.text).encode())
        return txt

    def write_extra(self, run: str, incident: str, name: str, data: bytes | str) -> Path:
        """Attach another artefact (e.g. an NCCL flight-recorder trace) to the incident."""
        safe = _sanitise(os.path.basename(name), "A-Za-z0-9._-", lower=False, default="extra")
        path = self.incident_dir(run, incident) / safe
        _atomic_write(path, data.encode() if isinstance(data, str) else data)
        return path

    def _info(self, run: str, folder: Path) -> IncidentInfo | None:
        match = _INCIDENT_RE.match(folder.name)
        if not match:
            return None
        try:
            when = datetime.strptime(match.group(1), TIME_FORMAT).replace(tzinfo=timezone.utc)
        except ValueError:
            return None
        ranks: set[int] = set()
        try:
            for entry in folder.iterdir():
                rank_match = _RANK_FILE_RE.match(entry.name)
                if rank_match and entry.is_file():
                    ranks.add(int(rank_match.group(1)))
        except OSError as exc:
            self._note(f"cannot read {folder}: {exc}")
        return IncidentInfo(run, folder.name, match.group(2), when, folder, sorted(ranks))

    def list_incidents(self, run: str | None = None, since: datetime | None = None) -> list[IncidentInfo]:
        """Every incident under the root (or of one run; or named no earlier than ``since``),
        newest first; anything else in the tree is ignored. ``since`` is judged from the folder
        names alone, so older incidents cost no stat and no listing (a shared filesystem)."""
        cutoff = since.astimezone(timezone.utc).strftime(TIME_FORMAT) if since is not None else None
        out: list[IncidentInfo] = []
        if not self.root.is_dir():
            return out
        runs = sorted(self.root.iterdir()) if run is None else [self.run_dir(run)]
        for run_dir in runs:
            if not run_dir.is_dir() or run_dir.name.startswith("."):
                continue
            try:
                folders = sorted(run_dir.iterdir())
            except OSError as exc:
                self._note(f"cannot read {run_dir}: {exc}")
                continue
            for folder in folders:
                if cutoff is not None and folder.name[: len(cutoff)] < cutoff:
                    continue
                info = self._info(run_dir.name, folder) if folder.is_dir() else None
                if info is not None:
                    out.append(info)
        out.sort(key=lambda i: (i.time, i.name, i.run), reverse=True)
        return out

    def find(self, incident: str, run: str | None = None) -> IncidentInfo:
        """By name (optionally ``run/name``), unique name prefix, or folder path."""
        as_path = Path(incident)
        if as_path.is_dir() and (info := self._info(as_path.resolve().parent.name, as_path.resolve())):
            return info
        if run is None and "/" in incident.strip("/"):
            run, _, incident = incident.strip("/").rpartition("/")
        candidates = [i for i in self.list_incidents() if run is None or i.run == sanitise_run(run)]
        exact = [i for i in candidates if i.name == incident]
        matches = exact or [i for i in candidates if i.name.startswith(incident)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise KeyError(f"no incident matches {incident!r} under {self.root}")
        names = ", ".join(f"{i.run}/{i.name}" for i in matches[:10])
        raise KeyError(
            f"{incident!r} is ambiguous ({len(matches)} incidents: {names}); give more of the name"
        )

    def load_rank(self, info: IncidentInfo, rank: int) -> dict[str, Any]:
        """The rank's JSON document; a missing or half-written one degrades to a failed dump."""
        json_path = info.path / f"rank-{rank}.json"
        problem: str
        try:
            doc = json.loads(json_path.read_text(errors="replace"))
            if isinstance(doc, dict):
                doc.setdefault("rank", rank)
                return doc
            problem = "not a JSON object"
        except FileNotFoundError:
            problem = "no JSON file"
        except (OSError, ValueError) as exc:
            problem = f"unreadable JSON ({exc})"
        self._note(f"{json_path}: {problem}")
        try:
            text = (info.path / f"rank-{rank}.txt").read_text(errors="replace")
        except OSError:
            text = ""
        return {"rank": rank, "pid": None, "ok": False, "error": problem, "threads": [], "text": text}
