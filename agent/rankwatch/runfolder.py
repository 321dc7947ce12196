"""The run folder: every file the agents of a run share, owned, checked and bounded.

Agents of one run tell each other things through small files in a shared folder: failure
and profile records (``<dumps>/<run>/.ranks``), the alert board and its claims
(``<board>/<run>/.alerts``), and beside each agent its alert spool and state. On a shared
filesystem (``/scratch`` is mode 1777, Slurm job ids are sequential) another user can
pre-create any of these folders, plant symlinks, FIFOs, devices or forged records in them,
and the agent may read with root's rights. So every one of them goes through here:

- **Folders as OpenSSH's StrictModes treats ``~/.ssh``.** A folder below the configured
  root is created by the agent (the job's user) with mode 0700, or 0750 with a group
  (``dumps.group``), walked one component at a time without following a symlink, and
  refused when it is owned by anyone but the agent or root, or is group- or
  world-writable. A refusal is an error that names the path and why, logged once per
  folder and counted in ``rankwatch_internal_errors_total{component=...}``.
- **Files through the rules of** :mod:`rankwatch.safeio`: no symlink followed
  (``O_NOFOLLOW``, ``lstat`` before and ``fstat`` after the open), regular files only, opened
  ``O_NONBLOCK`` so a FIFO never blocks, owned by the agent or root, not group/world-writable,
  and a size cap on every read (a 2 GiB sparse file or ``/dev/zero`` costs nothing). Writes go
  to a random ``O_EXCL`` temp name (``secrets.token_hex``) renamed over the target, so a
  symlink planted at a predictable name is never written through.
- **Records validated before they are believed** (:func:`check_record`): schema, run id,
  writer rank below the world size, timestamps not beyond a clock-skew bound in the future
  (a claim "from the future" expires), text cut to a bound. What fails is ignored and
  counted (``rejected``), never raised.

Every operation counts itself in :data:`OPS` (creates, renames, listings, reads, ...): the
bench (``bench/bench_runfolder.py``) shows the per-agent cost is O(1), not O(ranks).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import grp
import json
import logging
import math
import os
import secrets
import stat
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from rankwatch import safeio

log = logging.getLogger("rankwatch.runfolder")

__all__ = [
    "CLOCK_SKEW_S",
    "OPS",
    "RECORD_MAX",
    "Folder",
    "RunFolder",
    "bounded",
    "check_record",
    "resolve_group",
]

RECORD_MAX = 64 << 10  # a shared record larger than this is not one of ours
CLOCK_SKEW_S = 60.0  # default bound on how far in the future a peer's timestamp may lie
TEXT_MAX = 1000  # default bound on one text field of a shared record
OPS: Counter[str] = Counter()  # metadata operations, by kind (read by the bench)
_OPS_LOCK = threading.Lock()

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_NEW_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
)
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_logged: set[tuple[str, str]] = set()  # (path, why) said once; past LOGGED_MAX only counted
LOGGED_MAX = 1000


def _op(kind: str, n: int = 1) -> None:
    with _OPS_LOCK:
        OPS[kind] += n


@functools.lru_cache(maxsize=16)
def resolve_group(group: str | int | None) -> int | None:
    """The gid of ``dumps.group`` (a name or a number); None when unset or unknown (said once)."""
    if group is None or group == "":
        return None
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        log.error("dumps.group %r is no group on this node; the run folder stays 0700", group)
        return None


def bounded(value: Any, limit: int = TEXT_MAX) -> str | None:
    """A text field of a shared record, cut to ``limit`` characters; None if it is no text."""
    return value[:limit] if isinstance(value, str) else None


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_time(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1e11


def check_record(
    doc: Any,
    *,
    run: str | None,
    world: int | None,
    now: float,
    skew: float = CLOCK_SKEW_S,
    rank_key: str = "rank",
    time_key: str = "time",
    require: Sequence[str] = (),
) -> str | None:
    """Why a peer's record is not to be believed, or None when it may be.

    ``run``: the record's ``run`` must be this one (None: not checked). ``world``: its writer
    rank must lie in ``[0, world)`` (None: only ``>= 0``). Its time must be a wall-clock time
    no later than ``now + skew``: a record from the future is forged or from a clock far off,
    and either way must not win an election or suppress an alert."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    for key in require:
        if key not in doc:
            return f"no {key!r}"
    if run is not None and doc.get("run") != run:
        return "of another run"
    rank = doc.get(rank_key)
    if not _is_int(rank) or rank < 0:
        return "no valid rank"
    if world is not None and world > 0 and rank >= world:
        return f"rank {rank} outside a world of {world}"
    t = doc.get(time_key)
    if not _is_time(t):
        return "no valid time"
    if t > now + skew:
        return f"time {t - now:.0f}s in the future (clock skew bound {skew:.0f}s)"
    return None


def _refusal(
    path: str, why: str, errors: dict[str, int] | None, component: str, *, folder: bool = True
) -> safeio.Refused:
    if errors is not None:
        errors[component] = errors.get(component, 0) + 1
    _op("refused")
    if (path, why) not in _logged and len(_logged) < LOGGED_MAX:
        _logged.add((path, why))
        if folder:
            log.error(
                "refusing the shared run folder %s: %s (it must be this agent's user's or root's and "
                "writable by no one else; further refusals are only counted)",
                path,
                why,
            )
        else:
            log.error(
                "refusing %s in the shared run folder: %s (not read; further refusals counted)", path, why
            )
    return safeio.Refused(path, why)


class Folder:
    """An open, checked folder: every operation is relative to its descriptor. Use it inside
    ``RunFolder.open()``; its descriptor is closed on leaving."""

    def __init__(self, fd: int, label: str, owner: RunFolder, subs: list[int] | None = None) -> None:
        self.fd = fd
        self.label = label
        self.owner = owner
        self._subs: list[int] = [] if subs is None else subs  # shared with the sub-folders

    # --- names ---------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The names in the folder (one listing; nothing is stat'ed or opened)."""
        _op("list")
        with os.scandir(self.fd) as it:
            return [e.name for e in it]

    def sub(self, name: str, *, create: bool = True) -> Folder:
        """A checked sub-folder (made 0700/0750 where missing), closed with this one."""
        fd = self.owner._step(self.fd, name, os.path.join(self.label, name), create=create)
        self._subs.append(fd)
        return Folder(fd, os.path.join(self.label, name), self.owner, self._subs)

    def close(self) -> None:
        """Close this folder and every sub-folder opened through it."""
        for fd in [*self._subs, self.fd]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._subs.clear()

    # --- reads ---------------------------------------------------------------------------
    def _open_checked(self, name: str, flags: int | None = None) -> tuple[int, os.stat_result]:
        path = os.path.join(self.label, name)
        if flags is None:
            fd, st = safeio.open_file_beneath(self.fd, [name], label=self.label, owners=safeio.trusted_uids())
        else:
            before = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if not stat.S_ISREG(before.st_mode):
                raise safeio.Refused(path, f"is {safeio.kind_of(before.st_mode)}, not a regular file")
            try:
                fd = os.open(name, flags, dir_fd=self.fd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise safeio.Refused(path, "is a symlink, not a regular file") from None
                raise
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(st.st_mode):
                os.close(fd)
                raise safeio.Refused(path, "was replaced while being opened")
            if st.st_uid not in safeio.trusted_uids():
                os.close(fd)
                raise safeio.Refused(path, f"is owned by uid {st.st_uid}, not this agent's user or root")
        if st.st_mode & 0o022:
            os.close(fd)
            raise safeio.Refused(path, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})")
        return fd, st

    def read(self, name: str, limit: int = RECORD_MAX, *, tail: bool = False) -> bytes | None:
        """The file's bytes, or None when it is missing or refused (a refusal is logged once
        and counted). At most ``limit`` bytes are ever read: a larger file is refused, or with
        ``tail`` only its last ``limit`` bytes are read."""
        _op("read")
        try:
            fd, st = self._open_checked(name)
        except FileNotFoundError:
            return None
        except safeio.Refused as e:
            self.owner._file_refused(e)
            return None
        except OSError:
            return None
        try:
            if st.st_size > limit and not tail:
                self.owner._file_refused(
                    safeio.Refused(os.path.join(self.label, name), f"larger than {limit} bytes")
                )
                return None
            if st.st_size > limit:
                os.lseek(fd, st.st_size - limit, os.SEEK_SET)
            chunks: list[bytes] = []
            left = limit
            while left > 0:
                try:
                    data = os.read(fd, min(left, 1 << 20))
                except BlockingIOError:
                    break
                if not data:
                    break
                chunks.append(data)
                left -= len(data)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read_json(self, name: str, limit: int = RECORD_MAX) -> dict[str, Any] | None:
        data = self.read(name, limit)
        if data is None:
            return None
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return None
        return doc if isinstance(doc, dict) else None

    def size(self, name: str) -> int | None:
        """The size of a regular file of ours (checked as for a read), None if missing/refused."""
        _op("stat")
        try:
            fd, st = self._open_checked(name)
        except FileNotFoundError:
            return None
        except safeio.Refused as e:
            self.owner._file_refused(e)
            return None
        os.close(fd)
        return st.st_size

    def trusted(self, name: str, *, empty: bool = False) -> bool:
        """``name`` is a regular file of this agent's user or root, writable by no one else
        (one ``lstat``, nothing opened): for files whose name alone is believed (a claim,
        which is also ``empty``)."""
        _op("stat")
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        path = os.path.join(self.label, name)
        if not stat.S_ISREG(st.st_mode):
            why = f"is {safeio.kind_of(st.st_mode)}, not a regular file"
        elif st.st_uid not in safeio.trusted_uids():
            why = f"is owned by uid {st.st_uid}, not this agent's user or root"
        elif st.st_mode & 0o022:
            why = f"is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        elif empty and st.st_size:
            why = f"holds {st.st_size} bytes where an empty file belongs"
        else:
            return True
        self.owner._file_refused(safeio.Refused(path, why))
        return False

    def mtime(self, name: str) -> float | None:
        _op("stat")
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mtime
        except OSError:
            return None

    # --- writes --------------------------------------------------------------------------
    def _new(self, name: str) -> int:
        _op("create")
        fd = os.open(name, _NEW_FLAGS, self.owner.file_mode, dir_fd=self.fd)
        if self.owner.group is not None:
            with contextlib.suppress(OSError):
                os.fchown(fd, -1, self.owner.group)
        return fd

    def write(self, name: str, data: bytes, *, durable: bool = False) -> None:
        """Replace ``name`` by ``data``: a random ``O_EXCL`` temp file renamed over it, so a
        reader sees the old file or the new one and nothing planted at a name is followed."""
        tmp = f".{name[:80]}.{secrets.token_hex(8)}.tmp"
        fd = self._new(tmp)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            _op("rename")
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        if durable:
            with contextlib.suppress(OSError):
                os.fsync(self.fd)

    def write_json(self, name: str, doc: dict[str, Any], *, durable: bool = False) -> None:
        data = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str).encode()
        self.write(name, data, durable=durable)

    def create(self, name: str, data: bytes = b"") -> bool:
        """Exclusive create (a claim): True when this call made it, False when it was there."""
        try:
            fd = self._new(name)
        except FileExistsError:
            return False
        try:
            if data:
                os.write(fd, data)
        finally:
            os.close(fd)
        return True

    def append(self, name: str, data: bytes, *, durable: bool = True) -> int:
        """Append to ``name`` (created 0600/0640 when missing); returns its size after. A
        symlink, FIFO, device or another user's file there is refused, never written."""
        try:
            fd = self._new(name)
        except FileExistsError:
            _op("open")
            fd, _ = self._open_checked(name, _APPEND_FLAGS)
        try:
            start = os.lseek(fd, 0, os.SEEK_END)
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            except OSError:
                # A full disk takes part of the write: cut it off, or the next append is glued
                # to the torn line and lost with it.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                raise
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def unlink(self, name: str) -> bool:
        _op("unlink")
        try:
            os.unlink(name, dir_fd=self.fd)
            return True
        except OSError:
            return False

    def rename(self, name: str, new: str) -> None:
        _op("rename")
        os.replace(name, new, src_dir_fd=self.fd, dst_dir_fd=self.fd)


class RunFolder:
    """A folder below a configured ``base``: ``base/parts...``, each part checked (see the module
    docstring). ``base`` itself is the operator's (followed as configured, made if missing); a
    shared ``/scratch`` may be mode 1777."""

    def __init__(
        self,
        base: str | os.PathLike[str],
        *parts: str,
        group: int | None = None,
        errors: dict[str, int] | None = None,
        component: str = "runfolder",
        sticky_ok: bool = False,
    ) -> None:
        """``sticky_ok``: a world-writable folder with the sticky bit (``/tmp``) is accepted, for
        a folder that holds only files opened by their own name (spool, state), never one whose
        listing is believed (records, claims)."""
        if not parts:
            base_path = Path(os.path.abspath(os.fspath(base)))
            base, parts = base_path.parent, (base_path.name,)
        self.base = Path(base)
        self.parts = tuple(parts)
        self.group = group
        self.errors = errors
        self.component = component
        self.sticky_ok = sticky_ok
        self.refused: safeio.Refused | None = None  # the last refusal of the folder itself
        self.rejected = 0  # records and files ignored: refused, forged, out of bounds

    @property
    def path(self) -> Path:
        return self.base.joinpath(*self.parts)

    @property
    def dir_mode(self) -> int:
        return 0o750 if self.group is not None else 0o700

    @property
    def file_mode(self) -> int:
        return 0o640 if self.group is not None else 0o600

    def child(self, *names: str) -> RunFolder:
        """The same rules for a folder below this one."""
        return RunFolder(
            self.base,
            *self.parts,
            *names,
            group=self.group,
            errors=self.errors,
            component=self.component,
            sticky_ok=self.sticky_ok,
        )

    def reject(self, what: str, why: str) -> None:
        """A record not believed: counted (and logged once per kind of reason)."""
        self.rejected += 1
        _op("rejected")
        if self.errors is not None:
            self.errors[self.component] = self.errors.get(self.component, 0) + 1
        key = (str(self.path), why.split(" ")[0])
        if key not in _logged and len(_logged) < LOGGED_MAX:
            _logged.add(key)
            log.warning("ignoring %s in %s: %s (further ones only counted)", what, self.path, why)

    def _file_refused(self, e: safeio.Refused) -> None:
        self.rejected += 1
        _refusal(e.path, e.why, self.errors, self.component, folder=False)

    def _step(self, cur: int, name: str, where: str, *, create: bool) -> int:
        """Open ``name`` below ``cur`` (made where missing), checked: a real directory, ours or
        root's, writable by no one else."""
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise _refusal(where, f"{name!r} is not a plain folder name", self.errors, self.component)
        made = False
        try:
            _op("open")
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=cur)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # a peer made it meanwhile: checked below
                    _op("mkdir")
                    os.mkdir(name, self.dir_mode, dir_fd=cur)
                    made = True
                _op("open")
                fd = os.open(name, _DIR_FLAGS, dir_fd=cur)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                try:
                    st = os.stat(name, dir_fd=cur, follow_symlinks=False)
                    what = safeio.kind_of(st.st_mode)
                except OSError:
                    what = "not a directory"
                raise _refusal(where, f"is {what}, not a directory", self.errors, self.component) from None
            raise
        try:
            st = os.fstat(fd)
            if made:
                if self.group is not None:
                    with contextlib.suppress(OSError):
                        os.fchown(fd, -1, self.group)
                with contextlib.suppress(OSError):
                    os.fchmod(fd, self.dir_mode)  # whatever the umask took away or added
                st = os.fstat(fd)
            if st.st_uid not in safeio.trusted_uids():
                raise _refusal(
                    where,
                    f"is owned by uid {st.st_uid}, not by this agent's user (uid {os.geteuid()}) or root",
                    self.errors,
                    self.component,
                )
            if st.st_mode & 0o022 and not (self.sticky_ok and st.st_mode & stat.S_ISVTX):
                raise _refusal(
                    where,
                    f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}; "
                    f"want {self.dir_mode:o}): chmod go-w it",
                    self.errors,
                    self.component,
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    @contextlib.contextmanager
    def open(self, *, create: bool = True) -> Iterator[Folder]:
        """The checked folder, made where missing (``create``). Raises ``safeio.Refused`` (an
        ``OSError``) when a part of it is not to be trusted, ``FileNotFoundError`` when it is
        missing and not to be made."""
        flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
        _op("open")
        try:
            cur = os.open(self.base, flags)
        except FileNotFoundError:
            if not create:
                raise
            self.base.mkdir(parents=True, exist_ok=True)  # the configured root, as configured
            cur = os.open(self.base, flags)
        where = str(self.base)
        try:
            for name in self.parts:
                where = os.path.join(where, name)
                try:
                    nxt = self._step(cur, name, where, create=create)
                except safeio.Refused as e:
                    self.refused = e
                    raise
                os.close(cur)
                cur = nxt
        except BaseException:
            os.close(cur)
            raise
        folder = Folder(cur, where, self)
        try:
            yield folder
        finally:
            folder.close()

    def check(self, *, create: bool = True) -> safeio.Refused | None:
        """The refusal of this folder, or None when it is fine (or missing and not made)."""
        try:
            with self.open(create=create):
                return None
        except safeio.Refused as e:
            return e
        except OSError:
            return None
