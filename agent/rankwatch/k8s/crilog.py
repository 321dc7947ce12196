"""The kubelet's container log format (CRI), back to the lines the trainer printed.

Each line of ``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log`` is
``<RFC3339Nano time> <stdout|stderr> <tag> <text>`` (CRI logging spec, kubernetes
``staging/src/k8s.io/cri-api`` / kubelet ``pkg/kubelet/kuberuntime/logs/logs.go``
``parseCRILog``). The tag is ``F`` for a full line, ``P`` for a partial one: containerd and
CRI-O cut a line longer than their buffer (16 KiB by default) into ``P`` pieces followed
by one ``F`` piece, per stream. ``Joiner`` glues them back so a step line or a traceback
cut by the runtime reaches the parsers whole; it keeps the stdout and stderr pieces
apart, bounds what it holds, and keeps its pieces across a rotation (the kubelet renames
``0.log`` and the runtime reopens; a cut line continues in the new file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rankwatch.sources.lines import FollowedLine

__all__ = ["CriLine", "Joiner", "parse"]

# Time (RFC 3339 with nanoseconds), stream, tags (``F``/``P``, possibly ``:``-joined for
# future tags), then the text after one space (empty text: nothing after the tag).
_CRI = re.compile(r"(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) "
                  r"(?P<s>stdout|stderr) (?P<tag>[A-Z](?::[A-Z])*)(?: (?P<text>.*)|$)", re.S)  # fmt: skip


@dataclass(frozen=True)
class CriLine:
    time: str
    stream: str
    partial: bool
    text: str


def parse(line: str) -> CriLine | None:
    """One CRI log line; ``None`` when it is not one (then it is kept as it is)."""
    m = _CRI.match(line)
    if m is None:
        return None
    tags = m.group("tag").split(":")
    return CriLine(m.group("t"), m.group("s"), "P" in tags, m.group("text") or "")


class Joiner:
    """Stateful: feed each batch of followed lines, get the trainer's lines back."""

    def __init__(self, max_line_bytes: int) -> None:
        self.max_chars = max(1, max_line_bytes)
        self._pending: dict[str, tuple[int, list[str], int]] = {}  # stream -> first lineno, pieces, size
        self.joined = 0  # lines that were put back together from partial pieces

    def feed(self, batch: list[FollowedLine]) -> list[FollowedLine]:
        out: list[FollowedLine] = []
        for fl in batch:
            c = parse(fl.text)
            if c is None:
                out.append(fl)
                continue
            held = self._pending.pop(c.stream, None)
            if held is None and not c.partial:
                out.append(FollowedLine(c.text, fl.lineno, cut=fl.cut))
                continue
            first, pieces, size = held if held is not None else (fl.lineno, [], 0)
            cut = fl.cut
            if size < self.max_chars:
                piece = c.text[: self.max_chars - size]
                cut = cut or len(piece) < len(c.text)
                pieces.append(piece)
                size += len(piece)
            else:
                cut = True
            if c.partial:
                self._pending[c.stream] = (first, pieces, size)
                continue
            self.joined += 1
            out.append(FollowedLine("".join(pieces), first, cut=cut or size >= self.max_chars))
        return out

    def flush(self) -> list[FollowedLine]:
        """What is held when the container is gone (its last line never got its ``F``)."""
        out = [FollowedLine("".join(p), first, cut=True) for first, p, _ in self._pending.values()]
        self._pending.clear()
        return out
