"""Bytes to lines, the one splitter the live follower and the offline readers share, so they
can never disagree about what a line is or which number it has.

Splitting rules: ``\\n`` ends a line and advances the line number; ``\\r`` ends a segment
that keeps the line number of the ``\\n`` line it belongs to; empty segments (hence empty
lines and the gap in ``\\r\\n``) are dropped; bytes are decoded as ``encoding`` (``logs.encoding``,
UTF-8 by default; the loader accepts only encodings in which ``\\n`` and ``\\r`` are those bytes)
with replacement; a segment longer than ``max_line_bytes`` bytes is cut to its first
``max_line_bytes`` bytes (never splitting a character) and the rest of it is discarded; with ``drop``,
a segment holding it (and not ``RESCUE``) is skipped, its number kept for the next.

No asyncio here: a process that only reads (``sources.prefetch``) starts faster without it.
"""

from __future__ import annotations

import codecs
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

log = logging.getLogger("rankwatch.follower")

_MAX_CUT_WARNINGS = 10
# NCCL_DEBUG=INFO chatter: often most of a log's lines, never evidence of anything. A line
# holding this text is skipped unseen (a substring test runs at C speed; a regex did not).
NOISE = " NCCL INFO "
# ... unless it also holds this word: stdout is block-buffered and shares the file with
# NCCL's writes, so a step line (every format's holds "loss") can arrive glued to an INFO
# line. Testing it on each noise line costs a little less than counting it per chunk.
RESCUE = "loss"
_PIECE_BYTES = 32 << 10  # cache-sized batches of short-lived objects: measurably faster than 1 MiB


@dataclass(slots=True)
class FollowedLine:
    text: str  # without terminator
    lineno: int  # 1-based, counts \n lines of the current file generation
    cut: bool = False
    clean: bool = False  # a reader checked: no error-signature word in it (signatures.may_hold_signature)


@dataclass
class FollowerStats:
    lines: int = 0
    bytes_read: int = 0
    cut_lines: int = 0
    discarded_bytes: int = 0
    rotations: int = 0
    truncations: int = 0
    reopen_errors: int = 0
    refused_opens: int = 0  # a symlink, FIFO, device or another user's file where the log was
    dropped_lines: int = 0
    thinned_lines: int = 0  # passed over while a reader far behind thinned its reads (``thin``)


def _first_terminator(data: bytes) -> int:
    nl = data.find(b"\n")
    cr = data.find(b"\r", 0, nl if nl >= 0 else len(data))
    return cr if cr >= 0 else nl


class Splitter:
    """Byte stream to items; holds at most ``max_line_bytes`` of an unfinished segment."""

    __slots__ = (
        "_cut_warnings",
        "discarding",
        "drop",
        "encoding",
        "label",
        "lineno",
        "max_line_bytes",
        "pending",
        "piece_size",
        "stats",
        "thin",
    )

    def __init__(
        self,
        max_line_bytes: int,
        stats: FollowerStats,
        label: str,
        drop: str | None = None,
        encoding: str = "utf-8",
    ) -> None:
        if max_line_bytes < 4:  # room for one UTF-8 character
            raise ValueError("max_line_bytes must be >= 4")
        self.encoding = encoding
        self.max_line_bytes = max_line_bytes
        # A piece never exceeds the limit, so only its first segment can be too long.
        self.piece_size = min(max_line_bytes, _PIECE_BYTES)
        self.stats = stats
        self.label = label
        self.pending = bytearray()
        self.lineno = 1
        self.discarding = False
        self.drop = drop
        # When set: a piece whose text it says holds nothing that matters yields its last line
        # only (the step reached), the rest counted in ``thinned_lines``, never made objects.
        self.thin: Callable[[str], bool] | None = None
        self._cut_warnings = 0

    def reset(self) -> None:
        self.pending = bytearray()
        self.lineno = 1
        self.discarding = False

    def feed(self, data: bytes, out: list[FollowedLine]) -> None:
        size = self.piece_size
        if len(data) <= size:
            self.feed_piece(data, out)
            return
        for start in range(0, len(data), size):
            self.feed_piece(data[start : start + size], out)

    def flush(self, out: list[FollowedLine]) -> None:
        if self.pending:
            text = self.pending.decode(self.encoding, "replace")
            self.pending = bytearray()
            out.append(FollowedLine(text, self.lineno))
            self.stats.lines += 1
        self.discarding = False

    def feed_piece(self, piece: bytes, out: list[FollowedLine]) -> None:
        if self.discarding:
            first = _first_terminator(piece)
            if first < 0:
                self.stats.discarded_bytes += len(piece)
                return
            self.stats.discarded_bytes += first
            self.discarding = False
            piece = piece[first:]
        first = _first_terminator(piece)
        held = len(self.pending)
        if first < 0:
            if held + len(piece) > self.max_line_bytes:
                self._cut(self.pending + piece, out)
                self.discarding = True
            else:
                self.pending += piece
            return
        if held + first > self.max_line_bytes:
            self._cut(self.pending + piece[:first], out)
            piece = piece[first:]
        last = max(piece.rfind(b"\n"), piece.rfind(b"\r"))
        body: bytes | bytearray = piece[: last + 1]
        if self.pending:
            body = self.pending + body
        self.pending = bytearray(piece[last + 1 :])
        self._emit(body.decode(self.encoding, "replace"), out)

    def _emit(self, text: str, out: list[FollowedLine]) -> None:
        """``text`` ends with a terminator; one decode and one split per piece keeps it fast."""
        start = self.lineno
        before = len(out)
        drop = self.drop
        if "\r" not in text:
            parts = text.split("\n")
            parts.pop()
            self.lineno = start + len(parts)
            if self.thin is not None and len(parts) > 1 and not self.thin(text):
                last = len(parts) - 1
                while last > 0 and not parts[last]:
                    last -= 1
                self.stats.thinned_lines += len(parts) - parts.count("") - (1 if parts[last] else 0)
                if parts[last]:
                    out.append(FollowedLine(parts[last], start + last))
            elif drop is not None and drop in text:
                kept = [i for i, p in enumerate(parts) if drop not in p or RESCUE in p]
                self.stats.dropped_lines += len(parts) - len(kept)
                out.extend([FollowedLine(parts[i], start + i) for i in kept if parts[i]])
            elif "" in parts:
                out.extend([FollowedLine(t, n) for n, t in enumerate(parts, start) if t])
            else:
                out.extend(map(FollowedLine, parts, range(start, self.lineno)))
        else:
            # Noise is dropped per \r segment: a piece may end at any \r, so a decision per
            # \n line would depend on where reads happen to split it.
            parts = text.split("\n")
            lineno = start
            for part in parts:
                for seg in part.split("\r") if "\r" in part else (part,):
                    if not seg:
                        continue
                    if drop is not None and drop in seg and RESCUE not in seg:
                        self.stats.dropped_lines += 1
                    else:
                        out.append(FollowedLine(seg, lineno))
                lineno += 1
            self.lineno = start + len(parts) - 1
        self.stats.lines += len(out) - before

    def _cut(self, segment: bytes | bytearray, out: list[FollowedLine]) -> None:
        # final=False keeps a character that straddles the cut out instead of turning it into U+FFFD.
        head = bytes(segment[: self.max_line_bytes])
        if self.encoding == "utf-8":
            text, kept = codecs.utf_8_decode(head, "replace", False)
        else:
            decoder = codecs.getincrementaldecoder(self.encoding)("replace")
            text = decoder.decode(head, False)
            kept = len(head) - len(decoder.getstate()[0])
        self.pending = bytearray()
        out.append(FollowedLine(text, self.lineno, True))
        self.stats.lines += 1
        self.stats.cut_lines += 1
        self.stats.discarded_bytes += len(segment) - kept
        if self._cut_warnings < _MAX_CUT_WARNINGS:
            self._cut_warnings += 1
            more = " (further cuts are only counted)" if self._cut_warnings == _MAX_CUT_WARNINGS else ""
            log.warning(
                "%s: line %d longer than %d bytes, kept its first %d bytes%s",
                self.label,
                self.lineno,
                self.max_line_bytes,
                kept,
                more,
            )


def read_lines(
    path: str | os.PathLike[str] | int | BinaryIO,
    *,
    max_line_bytes: int = 1 << 20,
    chunk_size: int = 1 << 20,
    drop: str | None = None,
    stats: FollowerStats | None = None,
    label: str | None = None,
    start: int = 0,
    end: int | None = None,
    first_lineno: int = 1,
    encoding: str = "utf-8",
) -> Iterator[FollowedLine]:
    """Plain sequential read: no stat calls per chunk, for the offline path.

    A line containing ``drop`` (see ``NOISE``) is known noise, skipped unseen. ``path`` may
    be an open descriptor or a stream with ``read`` (a decompressed file), closed at the end;
    ``label`` names the file in warnings. A part of the file: bytes ``start`` to ``end``, its
    first line numbered ``first_lineno`` (``start`` must be where a line begins; not for a
    stream).
    """
    stats = stats if stats is not None else FollowerStats()
    splitter = Splitter(max_line_bytes, stats, label or str(path), drop, encoding)
    splitter.lineno = first_lineno
    out: list[FollowedLine] = []
    left = end - start if end is not None else -1
    stream = hasattr(path, "read")
    with path if stream else open(path, "rb", buffering=0) as fh:  # type: ignore[arg-type,union-attr]
        if start:
            fh.seek(start)
        size = splitter.piece_size
        while left and (data := fh.read(chunk_size if left < 0 else min(chunk_size, left))):
            left -= len(data) if left > 0 else 0
            for at in range(0, len(data), size):
                splitter.feed_piece(data[at : at + size], out)
                if out:
                    yield from out
                    out.clear()
    splitter.flush(out)
    yield from out
