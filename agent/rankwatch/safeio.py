"""Opening files the job can tamper with, without being its confused deputy.

The agent often reads with more rights than the job it watches (root, or
``CAP_DAC_READ_SEARCH``), in folders the job can write (its log folder, a shared dumps
folder). A symlink, FIFO or device put there must never make the agent read what the job
could not, or block on an open. So every open here walks from a directory descriptor one
component at a time with ``O_NOFOLLOW`` (``openat`` style: no path is looked up twice),
refuses ``..`` and symlinks at every step, opens only regular files (checked with
``lstat`` before the open, so a FIFO or a device is never opened at all, and with
``fstat`` after, so a swap in between is caught), and can insist on the file's owner.

A refusal is a :class:`Refused` (an ``OSError``, so existing ``except OSError`` paths
keep working) whose message names the path and the reason, never anything read from
the target.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence

__all__ = [
    "Refused",
    "kind_of",
    "open_dir",
    "open_dir_beneath",
    "open_file_beneath",
    "read_beneath",
    "resolve_dir",
    "sibling",
    "trusted_uids",
]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
# O_NONBLOCK: a FIFO swapped in between the lstat and the open must not hang the open.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
_MAX_SYMLINKS = 40  # as the kernel's own limit on a path lookup


class Refused(OSError):
    """The agent will not open this path: what is there is not what it may read."""

    def __init__(self, path: str | os.PathLike[str], why: str) -> None:
        super().__init__(errno.EPERM, why, os.fspath(path))
        self.path = os.fspath(path)
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def kind_of(mode: int) -> str:
    """What a file is, in words for a log line."""
    for test, name in (
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def trusted_uids() -> frozenset[int]:
    """Owners whose symlinks and folders the job cannot have made: root and the agent itself."""
    return frozenset({0, os.geteuid()})


def _check_name(name: str, where: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise Refused(os.path.join(where, name), "not a plain name inside its folder")


def _why_not_dir(dir_fd: int, name: str) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "not a directory"
    return f"is {kind_of(st.st_mode)}, not a directory"


def open_dir(path: str | os.PathLike[str]) -> int:
    """A descriptor of ``path`` whose every component is a real directory (no symlink at all).

    For a path already resolved once (:func:`resolve_dir`): a component swapped for a
    symlink since then is refused, not followed.
    """
    text = os.path.abspath(os.fspath(path))
    fd = os.open("/", _DIR_FLAGS)
    parts = [p for p in text.split("/") if p]
    try:
        return open_dir_beneath(fd, parts, label="/")
    finally:
        os.close(fd)


def open_dir_beneath(root_fd: int, parts: Sequence[str], *, label: str = "") -> int:
    """Walk ``parts`` from ``root_fd`` with ``O_NOFOLLOW|O_DIRECTORY``; the caller closes the result.

    ``root_fd`` stays open. ``label`` (the root's name) only makes the messages readable.
    """
    cur = os.dup(root_fd)
    where = label
    try:
        for name in parts:
            _check_name(name, where)
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=cur)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise Refused(os.path.join(where, name), _why_not_dir(cur, name)) from None
                raise
            os.close(cur)
            cur = nxt
            where = os.path.join(where, name)
        return cur
    except BaseException:
        os.close(cur)
        raise


def open_file_beneath(
    root_fd: int,
    parts: Sequence[str],
    *,
    label: str = "",
    owners: Iterable[int] | None = None,
    sibling_link: bool = False,
) -> tuple[int, os.stat_result]:
    """Open the regular file ``parts`` beneath ``root_fd`` read-only: ``(fd, fstat)``.

    Every folder on the way and the file itself must not be a symlink; the file must be
    a regular file (a FIFO or device is never opened) and, with ``owners``, owned by one
    of them. With ``sibling_link``, the file may be a symlink to a file of the same
    folder (``latest.log -> run-7.log``), which must then pass the same checks.
    Missing paths raise ``FileNotFoundError``; everything else refused, ``Refused``.
    """
    if not parts:
        raise Refused(label or ".", "no file named")
    *folders, name = parts
    path = os.path.join(label, *parts)
    dfd = open_dir_beneath(root_fd, folders, label=label)
    try:
        _check_name(name, os.path.join(label, *folders))
        before = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if sibling_link and stat.S_ISLNK(before.st_mode):
            beside = sibling(os.readlink(name, dir_fd=dfd), os.path.join(label, *folders))
            if beside is None:
                raise Refused(path, "is a symlink out of its folder")
            name = beside
            before = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(before.st_mode):
            raise Refused(path, f"is {kind_of(before.st_mode)}, not a regular file")
        allowed = None if owners is None else frozenset(owners)
        if allowed is not None and before.st_uid not in allowed:
            raise Refused(path, _owner_text(before.st_uid, allowed))
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused(path, "is a symlink, not a regular file") from None
            raise
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(st.st_mode):
                raise Refused(path, "was replaced while being opened")
            if allowed is not None and st.st_uid not in allowed:
                raise Refused(path, _owner_text(st.st_uid, allowed))
        except BaseException:
            os.close(fd)
            raise
        return fd, st
    finally:
        os.close(dfd)


def sibling(target: str, folder: str) -> str | None:
    """The name a symlink's ``target`` names in ``folder`` itself, or None when it leads
    anywhere else (another folder, ``..``, a path through another spelling of the folder)."""
    if target.startswith("/"):
        head, name = os.path.split(target)
        if head != folder.rstrip("/"):
            return None
        target = name
    if not target or target in (".", "..") or "/" in target:
        return None
    return target


def _owner_text(uid: int, allowed: frozenset[int]) -> str:
    want = " or ".join(f"uid {u}" for u in sorted(allowed)) or "nobody"
    return f"is owned by uid {uid}, not {want}"


def read_beneath(
    root: str | os.PathLike[str] | int, parts: Sequence[str], *, limit: int | None = None
) -> bytes:
    """The bytes of the regular file ``parts`` beneath ``root`` (a folder path, followed as
    configured, or a descriptor), at most ``limit`` of them."""
    if isinstance(root, int):
        return _read_fd_file(root, parts, "", limit)
    label = os.fspath(root)
    root_fd = os.open(label, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        return _read_fd_file(root_fd, parts, label, limit)
    finally:
        os.close(root_fd)


def _read_fd_file(root_fd: int, parts: Sequence[str], label: str, limit: int | None) -> bytes:
    fd, _ = open_file_beneath(root_fd, parts, label=label)
    try:
        chunks: list[bytes] = []
        remaining = limit
        while remaining is None or remaining > 0:
            data = os.read(fd, 1 << 20 if remaining is None else min(1 << 20, remaining))
            if not data:
                break
            chunks.append(data)
            if remaining is not None:
                remaining -= len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def resolve_dir(path: str | os.PathLike[str]) -> tuple[str, frozenset[int]]:
    """The folder ``path`` names now, with every symlink resolved, and the owners of the
    symlinks on the way that are not :func:`trusted_uids` (root or the agent).

    A folder given in the configuration is resolved once, here; later opens walk the
    result with :func:`open_dir`, so what the job swaps in afterwards is refused. A
    symlink someone else owns (``/home/alice/logs -> /scratch/alice``) is followed, but
    its owner decided where it points, so a file read through it must be theirs. Missing
    trailing components are kept as written (a folder created later).
    """
    trusted = trusted_uids()
    owners: set[int] = set()
    todo = [p for p in os.path.abspath(os.fspath(path)).split("/") if p]
    todo.reverse()
    done: list[str] = []
    hops = 0
    while todo:
        name = todo.pop()
        if name == ".":
            continue
        if name == "..":
            if done:
                done.pop()
            continue
        here = "/" + "/".join([*done, name])
        try:
            st = os.lstat(here)
        except OSError:
            done.append(name)
            done.extend(reversed(todo))
            break
        if not stat.S_ISLNK(st.st_mode):
            done.append(name)
            continue
        hops += 1
        if hops > _MAX_SYMLINKS:
            raise Refused(path, "too many symlinks")
        if st.st_uid not in trusted:
            owners.add(st.st_uid)
        target = os.readlink(here)
        if target.startswith("/"):
            done = []
        todo.extend(reversed([p for p in target.split("/") if p]))
    return "/" + "/".join(done), frozenset(owners)
