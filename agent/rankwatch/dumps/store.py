"""The on-disk dump layout: ``<root>/<run>/<UTC time>_<reason>/rank-<r>.txt`` (+ ``.json``).

One folder per incident keeps the dumps of all ranks of one hang together, which is
what ``dumps diff`` needs. Writes are atomic so a reader (or a crash mid-write) never
sees half a file, and reading tolerates whatever else lands in the folder.

The folder may be shared (cross-node incidents) and writable by others, while the agent
reads with privileges and serves what it reads over HTTP. So reading never follows a
symlink below the configured root: run and incident folders are walked with
``O_NOFOLLOW|O_DIRECTORY`` from the root's descriptor, only regular files are listed or
opened (``safeio``), and a symlink, FIFO or device is skipped or refused, never read.
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

from rankwatch import safeio
from rankwatch.dumps.capture import DumpResult
from rankwatch.records import Diagnosis
from rankwatch.sanitize import visible, visible_lines

log = logging.getLogger(__name__)

TIME_FORMAT = "%Y%m%dT%H%M%SZ"
_INCIDENT_RE = re.compile(r"^(\d{8}T\d{6}Z)_([a-z0-9_-]+)$")
_RANK_FILE_RE = re.compile(r"^rank-(\d+)\.(txt|json)$")
_ROOT_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
DUMP_FORMAT = 1
DIAGNOSIS_FILE = "diagnosis.json"


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
    # (run folder, incident folder) below the store's root, walked without following
    # symlinks; empty for a folder named by its path on the command line (opened as named).
    parts: tuple[str, ...] = ()


def _atomic_write(dir_fd: int, name: str, data: bytes) -> None:
    """Write ``name`` in the folder ``dir_fd`` through a new temporary file and a rename, so
    nothing already there (a symlink planted under that name) is ever followed or written."""
    tmp = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    # os.open rather than mkstemp so the umask, not 0600, decides who may read dumps.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
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

    def _incident_parts(self, run: str, incident: str) -> tuple[str, str]:
        return sanitise_run(run), _sanitise(incident, "A-Za-z0-9_-", lower=False, default="x")

    def _make_dirs(self, parts: tuple[str, ...]) -> int:
        """The descriptor of ``root/parts``, made where missing; a symlink on the way is refused."""
        self.root.mkdir(parents=True, exist_ok=True)  # the configured root, as configured
        cur = os.open(self.root, _ROOT_FLAGS)
        where = str(self.root)
        try:
            for i, name in enumerate(parts):
                try:
                    # The run folder (the first part) is the run folder's (rankwatch.runfolder):
                    # 0700, whatever the umask, or it would be refused as writable by others.
                    os.mkdir(name, 0o700 if i == 0 else 0o777, dir_fd=cur)
                except FileExistsError:
                    pass  # a symlink by that name is refused just below, not followed
                nxt = safeio.open_dir_beneath(cur, [name], label=where)
                os.close(cur)
                cur = nxt
                where = os.path.join(where, name)
            return cur
        except BaseException:
            os.close(cur)
            raise

    def incident_dir(self, run: str, incident: str) -> Path:
        parts = self._incident_parts(run, incident)
        os.close(self._make_dirs(parts))
        return self.root.joinpath(*parts)

    def write_rank(
        self, run: str, incident: str, rank: int, result: DumpResult, meta: dict[str, Any]
    ) -> Path:
        """Write ``rank-<r>.txt`` and ``rank-<r>.json``; returns the text file's path."""
        parts = self._incident_parts(run, incident)
        folder = self.root.joinpath(*parts)
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
        # The text file is read with cat: the job's text in it is shown, never obeyed.
        status = "ok" if result.ok else f"FAILED: {visible(result.error)}"
        header = f"# rankwatch dump: rank {rank}, pid {result.pid}, captured {captured}, {status}\n"
        notes = "".join(f"# note: {visible(n)}\n" for n in result.notes)
        dir_fd = self._make_dirs(parts)
        try:
            _atomic_write(dir_fd, f"rank-{rank}.json", json.dumps(doc, indent=1, default=str).encode())
            text = header + notes + "\n" + visible_lines(result.text)
            _atomic_write(dir_fd, f"rank-{rank}.txt", text.encode())
        finally:
            os.close(dir_fd)
        return folder / f"rank-{rank}.txt"

    def write_extra(self, run: str, incident: str, name: str, data: bytes | str) -> Path:
        """Attach another artefact (e.g. an NCCL flight-recorder trace) to the incident."""
        safe = _sanitise(os.path.basename(name), "A-Za-z0-9._-", lower=False, default="extra")
        parts = self._incident_parts(run, incident)
        dir_fd = self._make_dirs(parts)
        try:
            _atomic_write(dir_fd, safe, data.encode() if isinstance(data, str) else data)
        finally:
            os.close(dir_fd)
        return self.root.joinpath(*parts, safe)

    def write_diagnosis(self, info: IncidentInfo, diagnosis: Diagnosis) -> Path:
        """The live agents' judgement of the incident (world size, ranks without a stack, the
        first failure), so `dumps diff` later blames the rank they blamed."""
        return self.write_extra(
            info.run, info.name, DIAGNOSIS_FILE, json.dumps(diagnosis.to_json(), indent=1)
        )

    def load_diagnosis(self, info: IncidentInfo) -> Diagnosis | None:
        """The recorded judgement; None when there is none or it cannot be believed."""
        try:
            raw = self.read_file(info, DIAGNOSIS_FILE)
            if len(raw) > 1 << 20:
                return None
            return Diagnosis.from_json(json.loads(raw.decode(errors="replace")))
        except (OSError, ValueError, safeio.Refused):
            return None

    def _info(
        self, run: str, name: str, folder_fd: int, path: Path, parts: tuple[str, ...]
    ) -> IncidentInfo | None:
        match = _INCIDENT_RE.match(name)
        if not match:
            return None
        try:
            when = datetime.strptime(match.group(1), TIME_FORMAT).replace(tzinfo=timezone.utc)
        except ValueError:
            return None
        ranks: set[int] = set()
        try:
            with os.scandir(folder_fd) as entries:
                for entry in entries:
                    rank_match = _RANK_FILE_RE.match(entry.name)
                    if rank_match and entry.is_file(follow_symlinks=False):  # regular files only
                        ranks.add(int(rank_match.group(1)))
        except OSError as exc:
            self._note(f"cannot read {path}: {exc}")
        return IncidentInfo(run, name, match.group(2), when, path, sorted(ranks), parts)

    def _subdirs(self, fd: int, where: Path) -> list[str]:
        """Names of the real folders in ``fd`` (a symlink to one is not a folder here)."""
        try:
            with os.scandir(fd) as entries:
                return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except OSError as exc:
            self._note(f"cannot read {where}: {exc}")
            return []

    def _open_root(self) -> int | None:
        try:
            return os.open(self.root, _ROOT_FLAGS)  # the configured root itself may be a symlink
        except OSError:
            return None

    def list_incidents(self, run: str | None = None, since: datetime | None = None) -> list[IncidentInfo]:
        """Every incident under the root (or of one run; or named no earlier than ``since``),
        newest first; anything else in the tree is ignored. ``since`` is judged from the folder
        names alone, so older incidents cost no stat and no listing (a shared filesystem)."""
        cutoff = since.astimezone(timezone.utc).strftime(TIME_FORMAT) if since is not None else None
        out: list[IncidentInfo] = []
        root_fd = self._open_root()
        if root_fd is None:
            return out
        try:
            runs = self._subdirs(root_fd, self.root) if run is None else [sanitise_run(run)]
            for run_name in runs:
                if run_name.startswith("."):
                    continue
                out.extend(self._run_incidents(root_fd, run_name, cutoff))
        finally:
            os.close(root_fd)
        out.sort(key=lambda i: (i.time, i.name, i.run), reverse=True)
        return out

    def _run_incidents(self, root_fd: int, run_name: str, cutoff: str | None) -> list[IncidentInfo]:
        run_dir = self.root / run_name
        try:
            run_fd = safeio.open_dir_beneath(root_fd, [run_name], label=str(self.root))
        except FileNotFoundError:
            return []
        except OSError as exc:
            self._note(f"skipped {run_dir}: {exc}")
            return []
        out: list[IncidentInfo] = []
        try:
            for name in self._subdirs(run_fd, run_dir):
                if (cutoff is not None and name[: len(cutoff)] < cutoff) or not _INCIDENT_RE.match(name):
                    continue
                try:
                    folder_fd = safeio.open_dir_beneath(run_fd, [name], label=str(run_dir))
                except OSError as exc:  # swapped for a symlink since the listing
                    self._note(f"skipped {run_dir / name}: {exc}")
                    continue
                try:
                    info = self._info(run_name, name, folder_fd, run_dir / name, (run_name, name))
                finally:
                    os.close(folder_fd)
                if info is not None:
                    out.append(info)
        finally:
            os.close(run_fd)
        return out

    def _info_of_folder(self, folder: Path) -> IncidentInfo | None:
        """An incident named by its folder's path. Below the root (as written or resolved) it
        is read like any other incident of the store, so a symlinked folder there is not
        found; elsewhere the user chose that folder, and it is opened as given."""
        roots = (Path(os.path.abspath(self.root)), self.root.resolve())
        for where in (Path(os.path.abspath(folder)), folder.resolve()):
            if where.parent.parent in roots:
                named = self._run_incidents_named(where.parent.name, where.name)
                return named[0] if named else None
        real = folder.resolve()
        try:
            fd = os.open(real, _ROOT_FLAGS)
        except OSError:
            return None
        try:
            return self._info(real.parent.name, real.name, fd, real, ())
        finally:
            os.close(fd)

    def _run_incidents_named(self, run_name: str, name: str) -> list[IncidentInfo]:
        return [i for i in self.list_incidents(run_name) if i.name == name and i.run == run_name]

    def find(self, incident: str, run: str | None = None, *, allow_path: bool = True) -> IncidentInfo:
        """By name (optionally ``run/name``), unique name prefix, or (``allow_path``: the
        command line, not the HTTP API) folder path."""
        as_path = Path(incident)
        if allow_path and as_path.is_dir() and (info := self._info_of_folder(as_path)):
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

    def read_file(self, info: IncidentInfo, name: str) -> bytes:
        """A regular file of the incident, never through a symlink below the root.

        ``FileNotFoundError`` when missing; ``safeio.Refused`` for a symlink, FIFO, device or
        a folder on the way that is not a real one."""
        if info.parts:
            return safeio.read_beneath(self.root, [*info.parts, name])
        return safeio.read_beneath(info.path, [name])

    def load_rank(self, info: IncidentInfo, rank: int, *, strict: bool = False) -> dict[str, Any]:
        """The rank's JSON document; a missing or half-written one degrades to a failed dump.

        A file refused by ``safeio`` (a symlink, FIFO, device) is never read: it degrades the
        same way, naming why, or with ``strict`` (the HTTP API) raises ``safeio.Refused``."""
        json_name = f"rank-{rank}.json"
        json_path = info.path / json_name
        problem: str
        try:
            doc = json.loads(self.read_file(info, json_name).decode(errors="replace"))
            if isinstance(doc, dict):
                doc.setdefault("rank", rank)
                return doc
            problem = "not a JSON object"
        except FileNotFoundError:
            problem = "no JSON file"
        except safeio.Refused as exc:
            if strict:
                raise
            problem = f"not read: {exc.why}"
        except (OSError, ValueError) as exc:
            problem = f"unreadable JSON ({exc})"
        self._note(f"{json_path}: {problem}")
        try:
            text = self.read_file(info, f"rank-{rank}.txt").decode(errors="replace")
        except safeio.Refused:
            if strict:
                raise
            text = ""
        except OSError:
            text = ""
        return {"rank": rank, "pid": None, "ok": False, "error": problem, "threads": [], "text": text}
