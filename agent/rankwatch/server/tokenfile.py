"""The API token when none is configured: made at start, kept where only its user can read it.

Loopback is no trust boundary on a shared node: every other user's job on it can connect to
127.0.0.1, and ``/api/dumps`` carries command lines (API keys passed as flags) and, with
``dumps.locals``, data. So an agent without ``server.token`` makes a random token and writes
it to ``token`` in the user's runtime folder — ``$XDG_RUNTIME_DIR/rankwatch`` (systemd's
per-user tmpfs, 0700, gone at logout), or ``<tmp>/rankwatch-<uid>`` when that is unset — as
Jupyter does. The CLI (``rankwatch top``, ``rankwatch url``) reads the same file, so the
user who started the agent needs no configuration, and nobody else can read the stacks.

All agents of one user on one node share the file: the first to start creates it, the rest
read it (a later agent replacing it would lock the CLI out of the earlier ones). The folder
and the file are refused, loudly, unless they are this user's, not reachable through a
symlink, and closed to group and others (as OpenSSH's StrictModes treats ``~/.ssh``): in a
1777 ``/tmp`` another user may have made ``rankwatch-<uid>`` first, to read or plant the token.
The file is created under a random ``O_EXCL`` name and linked into place, so a reader never
sees half a token and two agents starting together agree on one.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

TOKEN_NAME = "token"
_TOKEN_RE = re.compile(r"^[A-Za-z0-9_-]{32,256}$")
_MAX_BYTES = 512
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | _CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC


class UnsafeTokenFile(OSError):
    """The runtime folder or the token file cannot be trusted; the message names the path."""


def runtime_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the token lives: ``$XDG_RUNTIME_DIR/rankwatch``, else ``<tmp>/rankwatch-<uid>``."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_RUNTIME_DIR", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "rankwatch"
    return Path(tempfile.gettempdir()) / f"rankwatch-{os.geteuid()}"


def token_path(env: Mapping[str, str] | None = None) -> Path:
    return runtime_dir(env) / TOKEN_NAME


def _check_private(st: os.stat_result, path: Path, what: str) -> None:
    if st.st_uid != os.geteuid():
        raise UnsafeTokenFile(
            errno.EPERM, f"{path}: {what} is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
        )
    if st.st_mode & 0o077:
        raise UnsafeTokenFile(
            errno.EPERM, f"{path}: {what} is open to group or others (mode {stat.S_IMODE(st.st_mode):o})"
        )


def _open_dir(path: Path, *, create: bool) -> int:
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeTokenFile(e.errno, f"{path}: not a folder (a symlink?); refusing it") from None
        raise
    try:
        _check_private(os.fstat(fd), path, "the folder")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(dir_fd: int, path: Path) -> str:
    try:
        fd = os.open(TOKEN_NAME, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeTokenFile(e.errno, f"{path}: a symlink; refusing it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeTokenFile(errno.EPERM, f"{path}: not a regular file; refusing it")
        _check_private(st, path, "the file")
        data = os.read(fd, _MAX_BYTES)
    finally:
        os.close(fd)
    text = data.decode("ascii", "replace").strip()
    if not _TOKEN_RE.fullmatch(text):
        raise UnsafeTokenFile(errno.EINVAL, f"{path}: does not hold a token")
    return text


def read_token(env: Mapping[str, str] | None = None) -> str | None:
    """The token the agents of this user on this node use, or None when there is none yet.
    Raises ``UnsafeTokenFile`` when the folder or file is not private to this user."""
    path = token_path(env)
    try:
        fd = _open_dir(path.parent, create=False)
    except FileNotFoundError:
        return None
    try:
        return _read(fd, path)
    except FileNotFoundError:
        return None
    finally:
        os.close(fd)


def ensure_token(env: Mapping[str, str] | None = None) -> tuple[str, Path]:
    """The shared token, made now when there is none: ``(token, path)``. Raises ``OSError``
    (``UnsafeTokenFile`` for a folder or file another user could read or plant)."""
    path = token_path(env)
    fd = _open_dir(path.parent, create=True)
    try:
        try:
            return _read(fd, path), path
        except FileNotFoundError:
            pass
        token = secrets.token_urlsafe(32)
        tmp = f".{TOKEN_NAME}.{secrets.token_hex(8)}.tmp"
        wfd = os.open(tmp, _CREATE_FLAGS, 0o600, dir_fd=fd)
        try:
            try:
                os.write(wfd, token.encode() + b"\n")
                os.fsync(wfd)
            finally:
                os.close(wfd)
            try:
                os.link(tmp, TOKEN_NAME, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
            except FileExistsError:  # another agent of this user won the race: use its token
                return _read(fd, path), path
        finally:
            try:
                os.unlink(tmp, dir_fd=fd)
            except FileNotFoundError:
                pass
        return token, path
    finally:
        os.close(fd)
