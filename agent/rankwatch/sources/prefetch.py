"""A big finished log read in a second process, so that reading it (and dropping its noise)
overlaps parsing it and running the detectors: `analyze` on one large file with two cores.

The child runs ``main(FD MAX_LINE_BYTES LABEL START [COMPRESSION])`` in a fresh
interpreter. It reads the file the parent opened (its descriptor is passed on, so the parent
alone reports a path it cannot open) from byte START, where a line begins, and writes the
kept lines in pickled batches, then None: without that end mark the parent reads the rest
itself rather than pass a partial read off as the whole log. A compressed file is read
whole by the child, which decompresses it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from rankwatch.sources.compressed import open_decompressed
from rankwatch.sources.lines import NOISE, FollowedLine, read_lines
from rankwatch.sources.signatures import may_hold_signature

log = logging.getLogger("rankwatch.prefetch")

# The child writes small batches into a big pipe: it runs up to a megabyte of kept lines
# ahead instead of waiting, with a full buffer, until the parent has parsed all of it.
_PIPE_BYTES = 1 << 20
_WRITE_BYTES = 64 << 10
# Read here while the child starts (~0.05 s): about what this process parses meanwhile.
HEAD_BYTES = 16 << 20
_NEAR = 64 << 10  # a line that long at the head's end: no head, the child reads it all


def _line_end(fd: int, at: int) -> int:
    """Just past the newline that ends the line holding byte ``at``; 0 when none is near."""
    tail = os.pread(fd, _NEAR, at)
    i = tail.find(b"\n")
    return at + i + 1 if i >= 0 else 0


# Isolated (-I: no PYTHONPATH, no current directory on the path), the child imports this
# very copy of rankwatch: its folder goes first on the path unless the path already has it
# (an installed copy, whose folder is site-packages: never put ahead of the standard library).
_CHILD = (
    "import sys; r = sys.argv[1]; r in sys.path or sys.path.insert(0, r); "
    "from rankwatch.sources.prefetch import main; sys.exit(main(sys.argv[2:]))"
)


def _first_lineno(fd: int, start: int) -> int:
    """The number of the line that begins at byte ``start``."""
    return os.pread(fd, start, 0).count(b"\n") + 1 if start else 1


def _start(
    fd: int, max_line_bytes: int, label: str, start: int, compression: str | None = None
) -> subprocess.Popen[bytes] | None:
    here = str(Path(__file__).resolve().parents[2])
    args = [here, str(fd), str(max_line_bytes), label, str(start)] + ([compression] if compression else [])
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            pass_fds=(fd,),
            bufsize=_WRITE_BYTES,
        )
    except OSError as e:
        log.warning("%s: cannot start a process to read it (%s); reading it here", label, e)
        return None


def prefetched_lines(
    path: str, *, max_line_bytes: int, head_bytes: int = HEAD_BYTES, compression: str | None = None
) -> Iterator[FollowedLine]:
    """What ``read_lines(path, drop=NOISE)`` yields: the first ``head_bytes`` (to the end of
    a line) read here while the child starts, the rest by the child. If the child fails, the
    rest is read here from the line after the last one it sent: logged, nothing lost or
    handed out twice. ``compression`` (``sources.compressed``): the child reads it all."""
    with open(path, "rb") as fh:
        fd = fh.fileno()
        split = _line_end(fd, head_bytes) if head_bytes > 0 and compression is None else 0
        proc = _start(fd, max_line_bytes, path, split, compression)
    last, same = 0, 0  # line number of the last line sent, and how many segments of it
    done = False
    try:
        if proc is not None:
            assert proc.stdout is not None
            with contextlib.suppress(AttributeError, OSError):  # Linux only; the default 64 KiB works too
                fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        if split:
            yield from read_lines(path, max_line_bytes=max_line_bytes, drop=NOISE, end=split)
        if proc is not None:
            assert proc.stdout is not None
            # Whatever the child's stream holds that is not a batch ends it: the rest is read here.
            with contextlib.suppress(Exception), proc.stdout as out:
                # Our own child's batches: (texts, line numbers, cut flags, clean flags); None ends.
                while (batch := pickle.load(out)) is not None:
                    yield from map(FollowedLine, *batch)
                    numbers = batch[1]
                    if numbers:
                        n = numbers.count(numbers[-1])  # \r segments of one line are adjacent
                        same = n + same if n == len(numbers) and numbers[-1] == last else n
                        last = numbers[-1]
                done = True
    finally:
        code = None
        if proc is not None:
            if proc.poll() is None and not done:
                proc.kill()
            code = proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
    if done and code == 0:
        return
    if proc is not None:
        log.warning(
            "%s: the process reading it stopped (exit %s) after line %d; reading the rest here",
            path,
            code,
            last,
        )
    if compression is not None:
        source = open_decompressed(path, compression)
        rest = read_lines(source, max_line_bytes=max_line_bytes, drop=NOISE, label=path)
    else:
        with open(path, "rb") as fh:
            first = _first_lineno(fh.fileno(), split)
        rest = read_lines(path, max_line_bytes=max_line_bytes, drop=NOISE, start=split, first_lineno=first)
    for fl in rest:
        if fl.lineno < last or (fl.lineno == last and same > 0):
            same -= fl.lineno == last
            continue
        yield fl


def _clean(texts: list[str]) -> list[bool]:
    """The gate runs once over a batch: error lines are rare, so a batch without any gate
    word (or ANSI code, which may split one) spares a test per line."""
    joined = "\n".join(texts)
    if "\x1b" not in joined and not may_hold_signature(joined):
        return [True] * len(texts)
    return ["\x1b" not in t and not may_hold_signature(t) for t in texts]


def _serve(fd: int, max_line_bytes: int, label: str, start: int, compression: str | None = None) -> int:
    first = _first_lineno(fd, start) if compression is None else 1
    source = open_decompressed(fd, compression, label) if compression is not None else fd
    batch: list[FollowedLine] = []
    held = 0
    try:
        with open(sys.stdout.fileno(), "wb", buffering=_WRITE_BYTES, closefd=False) as out:

            def send() -> None:
                texts = [fl.text for fl in batch]
                numbers = [fl.lineno for fl in batch]
                cuts = [fl.cut for fl in batch]
                pickle.dump((texts, numbers, cuts, _clean(texts)), out, pickle.HIGHEST_PROTOCOL)
                batch.clear()

            lines = read_lines(
                source,
                max_line_bytes=max_line_bytes,
                drop=NOISE,
                label=label,
                start=start,
                first_lineno=first,
            )
            for fl in lines:
                batch.append(fl)
                held += len(fl.text)
                if held >= _WRITE_BYTES:
                    send()
                    held = 0
            send()
            pickle.dump(None, out)
    except BrokenPipeError:  # the parent stopped reading: nothing left to do
        with open(os.devnull, "w") as sink:
            os.dup2(sink.fileno(), sys.stdout.fileno())
        return 1
    return 0


def main(argv: list[str]) -> int:
    """The child: ``FD MAX_LINE_BYTES LABEL START [COMPRESSION]``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends us
    logging.basicConfig(
        level=logging.WARNING, format="rankwatch %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    return _serve(int(argv[0]), int(argv[1]), argv[2], int(argv[3]), argv[4] if len(argv) > 4 else None)
