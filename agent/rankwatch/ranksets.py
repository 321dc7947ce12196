"""Sets of ranks as a human reads them: ranges, strides and counts.

A hang at 4,096 ranks puts thousands of rank numbers in every line that names "the ranks
waiting in all_reduce": tens of kilobytes nobody reads. What a person wants is the shape
of the set: ``0-4095``, ``ranks 0,4-7,9 (6)``, ``2,048 ranks: odd 1-4095`` (every other
rank: one tensor-parallel half), ``0-4092 step 4`` (one rank per node of four).

The body (``format_ranks``) is a comma-separated list of items, each a single rank ``N``,
a run ``A-B`` or an arithmetic progression ``A-B step D`` (``odd A-B`` / ``even A-B`` for
step 2 when the whole set is one such progression). ``parse_ranks`` reads every form this
module prints back to the same set, so a rank set copied from a report or an alert can be
pasted into a command.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# A progression with a stride is worth its words from this many members on; below it the
# ranks are listed one by one ("0,2,4" reads better than "0-4 step 2").
MIN_STRIDE_RUN = 4

_ITEM_RE = re.compile(
    r"^(?:(?P<parity>odd|even)\s+)?(?P<a>\d+)(?:\s*-\s*(?P<b>\d+)(?:\s+step\s+(?P<step>\d+))?)?$"
)
_COUNT_TAIL_RE = re.compile(r"\s*\((?:[\d,]+|\+[\d,]+ more)\)\s*$")
_COUNT_HEAD_RE = re.compile(r"^[\d,]+\s+ranks?:\s*")


def _items(ranks: list[int], min_run: int) -> list[tuple[int, int, int]]:
    """(first, last, step) items covering ``ranks`` (sorted, unique), greedily left to right."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(ranks)
    while i < n:
        if i + 1 < n:
            step = ranks[i + 1] - ranks[i]
            j = i + 1
            while j + 1 < n and ranks[j + 1] - ranks[j] == step:
                j += 1
            length = j - i + 1
            if step == 1 and length >= min_run:
                out.append((ranks[i], ranks[j], 1))
                i = j + 1
                continue
            listed = len(",".join(map(str, ranks[i : j + 1])))
            if step > 1 and length >= MIN_STRIDE_RUN and len(f"{ranks[i]}-{ranks[j]} step {step}") < listed:
                out.append((ranks[i], ranks[j], step))
                i = j + 1
                continue
        out.append((ranks[i], ranks[i], 1))
        i += 1
    return out


def _item_text(first: int, last: int, step: int, *, whole: bool) -> str:
    if first == last:
        return str(first)
    if step == 1:
        return f"{first}-{last}"
    if step == 2 and whole:
        return f"{'odd' if first % 2 else 'even'} {first}-{last}"
    return f"{first}-{last} step {step}"


def format_ranks(ranks: Iterable[int], *, sep: str = ",", min_run: int = 3, limit: int | None = None) -> str:
    """``0,1,3``, ``0-7,9``, ``odd 1-4095``, ``0-4092 step 4``: every rank of the set, compact.

    Runs of ``min_run`` or more consecutive ranks are collapsed (3 by default: ``0,1`` stays
    two ranks). With ``limit``, at most that many items are printed and the rest counted
    (``0-3,9,12 (+40 more)``): short, but no longer the whole set.
    """
    rs = sorted(set(ranks))
    items = _items(rs, max(2, min_run))
    whole = len(items) == 1
    texts = [_item_text(a, b, s, whole=whole) for a, b, s in items]
    if limit is not None and len(texts) > limit:
        shown_items = items[:limit]
        shown = sum(len(range(a, b + 1, s)) for a, b, s in shown_items)
        return sep.join(texts[:limit]) + f" (+{len(rs) - shown:,} more)"
    return sep.join(texts)


def describe_ranks(ranks: Iterable[int], *, limit: int | None = 24) -> str:
    """``rank 3``, ``ranks 0,4-7,9 (6)``, ``2,048 ranks: odd 1-4095``, ``no ranks``."""
    rs = sorted(set(ranks))
    if not rs:
        return "no ranks"
    if len(rs) == 1:
        return f"rank {rs[0]}"
    body = format_ranks(rs, limit=limit)
    if "," not in body and " " in body and "more" not in body:  # one stride: the count leads
        return f"{len(rs):,} ranks: {body}"
    if "more)" in body:
        return f"{len(rs):,} ranks: {body}"
    return f"ranks {body} ({len(rs):,})"


def parse_ranks(text: str) -> list[int]:
    """The ranks of any form ``format_ranks`` or ``describe_ranks`` prints (sorted, unique).

    ``ValueError`` for anything else, and for a form cut short by ``limit``: the ranks it no
    longer names cannot be read back.
    """
    body = text.strip()
    if "more)" in body:
        raise ValueError(f"{text!r} names only part of its ranks")
    body = _COUNT_HEAD_RE.sub("", body)
    if body.startswith("ranks "):
        body = body[len("ranks ") :]
    elif body.startswith("rank "):
        body = body[len("rank ") :]
    body = _COUNT_TAIL_RE.sub("", body)
    if body in ("", "no ranks"):
        return []
    out: set[int] = set()
    for raw in body.split(","):
        m = _ITEM_RE.match(raw.strip())
        if m is None:
            raise ValueError(f"not a rank set item: {raw.strip()!r}")
        a = int(m.group("a"))
        b = int(m.group("b")) if m.group("b") is not None else a
        step = int(m.group("step")) if m.group("step") is not None else (2 if m.group("parity") else 1)
        if b < a or step < 1 or (b - a) % step:
            raise ValueError(f"not a rank range: {raw.strip()!r}")
        if m.group("parity") and (a % 2 == 1) != (m.group("parity") == "odd"):
            raise ValueError(f"{raw.strip()!r}: the first rank's parity contradicts the word")
        out.update(range(a, b + 1, step))
    return sorted(out)
