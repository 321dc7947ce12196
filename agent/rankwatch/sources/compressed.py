"""Logs compressed after the run (logrotate, a job's epilogue, an archive): read as the text
they hold, so `analyze slurm-1234.out.gz` needs no zcat first.

A compressed file is known by its first bytes, not its name. gzip, bzip2 and xz come with
Python. A stream that ends early (a copy taken while it was being written) or turns corrupt
midway yields what it held up to there, with one warning naming the file: the part that
can be read is still worth analysing, and a traceback at its end is often why it was cut.
"""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import os
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

__all__ = [
    "READABLE",
    "SUFFIXES",
    "UnreadableCompression",
    "compression_of",
    "open_decompressed",
    "require_readable",
    "stream_text",
]

log = logging.getLogger("rankwatch.compressed")

_MAGIC = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)
READABLE = frozenset({"gzip", "bzip2", "xz"})
# Name endings a folder's compressed logs carry (`analyze DIR` picks them up).
SUFFIXES = (".gz", ".bz2", ".xz")


class UnreadableCompression(ValueError):
    """A compressed file in a format Python cannot read without another package."""


def compression_of(path: str | os.PathLike[str]) -> str | None:
    """``gzip``, ``bzip2``, ``xz``, ``zstd`` or None (not compressed, or unreadable: the
    caller's own open reports that)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(6)
    except OSError:
        return None
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    return None


_OPENERS: dict[str, Callable[[BinaryIO], Any]] = {
    "gzip": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    "bzip2": bz2.BZ2File,
    "xz": lzma.LZMAFile,
}


class _Decompressed:
    """``read(n)`` over the decompressed text; an early end or corruption ends it quietly
    (logged once) instead of raising, as a short file would."""

    def __init__(self, raw: BinaryIO, kind: str, label: str) -> None:
        self._raw = raw
        self._kind = kind
        self._label = label
        self._text_bytes = 0
        self._ended = False
        self._f = _OPENERS[kind](raw)

    def read(self, n: int = -1) -> bytes:
        if self._ended:
            return b""
        try:
            # read1: one step of decompression per call. read(n) would gather n bytes over
            # several, and an early end among them would lose all that it had gathered.
            data: bytes = self._f.read1(n)
        except (EOFError, OSError, zlib.error, lzma.LZMAError) as e:
            self._ended = True
            why = "ends early" if isinstance(e, EOFError) else f"is corrupt ({e})"
            log.warning(
                "%s: the %s stream %s after %d bytes of text; analysing what it held",
                self._label,
                self._kind,
                why,
                self._text_bytes,
            )
            return b""
        self._text_bytes += len(data)
        return data

    def close(self) -> None:
        try:
            self._f.close()
        finally:
            self._raw.close()

    def __enter__(self) -> _Decompressed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def require_readable(kind: str, label: str) -> None:
    """Raise ``UnreadableCompression``, naming the file and what to do, unless ``kind`` is read here."""
    if kind in READABLE:
        return
    tool = "zstd" if kind == "zstd" else kind
    if label == "<stdin>":
        fix = f"decompress it in the pipe: {tool} -dc FILE | rankwatch analyze -"
    else:
        fix = f"decompress it first: zstd -d {label}" if kind == "zstd" else "decompress it first"
    raise UnreadableCompression(
        f"{label}: {kind}-compressed, which rankwatch cannot read (it reads gzip, bzip2 and xz); {fix}"
    )


def open_decompressed(source: str | os.PathLike[str] | int, kind: str, label: str | None = None) -> BinaryIO:
    """The text of a compressed file (a path, or a descriptor it takes over) as a stream
    with ``read``; ``label`` names it in warnings."""
    name = str(label or source)
    require_readable(kind, name)
    raw = open(source, "rb")  # noqa: SIM115 - closed by the stream
    return _Decompressed(raw, kind, name)  # type: ignore[return-value]


def stream_text(raw: io.BufferedReader, label: str) -> BinaryIO:
    """A stream that may be compressed (``gzip -c log | rankwatch analyze -``): known by its
    first bytes, which ``peek`` shows without taking them (a pipe cannot be read twice)."""
    head = raw.peek(6)[:6]
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            require_readable(kind, label)
            return _Decompressed(raw, kind, label)  # type: ignore[return-value]
    return raw
