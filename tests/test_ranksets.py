"""Rank sets as ranges, strides and counts: what they print, and that it reads back."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from rankwatch.dumps.diff import diff_incident, format_diff
from rankwatch.ranksets import describe_ranks, format_ranks, parse_ranks

pytestmark = pytest.mark.unit
PROPS = settings(max_examples=fuzz_examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

RANKS = st.sets(st.integers(min_value=0, max_value=5000), max_size=300)


def _progression() -> st.SearchStrategy[set[int]]:
    return st.builds(
        lambda a, step, n: set(range(a, a + step * n, step)),
        st.integers(0, 64),
        st.integers(1, 9),
        st.integers(1, 600),
    )


SETS = st.one_of(RANKS, _progression(), st.builds(lambda a, b: a | b, _progression(), RANKS))


def test_the_forms_people_read() -> None:
    assert format_ranks([0, 4, 5, 6, 7, 9]) == "0,4-7,9"
    assert describe_ranks([0, 4, 5, 6, 7, 9]) == "ranks 0,4-7,9 (6)"
    assert describe_ranks(range(1, 4096, 2)) == "2,048 ranks: odd 1-4095"
    assert describe_ranks(range(0, 4096, 2)) == "2,048 ranks: even 0-4094"
    assert describe_ranks(range(0, 4093, 4)) == "1,024 ranks: 0-4092 step 4"
    assert describe_ranks(range(4096)) == "ranks 0-4095 (4,096)"
    assert describe_ranks([3]) == "rank 3" and describe_ranks([]) == "no ranks"
    assert format_ranks([0, 1, 3]) == "0,1,3"  # two in a row stay two ranks
    assert format_ranks([0, 1, 3], sep=", ", min_run=2) == "0-1, 3"


def test_a_limit_keeps_lines_short_and_says_how_many_are_left_out() -> None:
    scattered = [r for r in range(4096) if r % 7 in (0, 3)]
    text = describe_ranks(scattered, limit=8)
    assert text.startswith(f"{len(scattered):,} ranks: ") and "more)" in text and len(text) < 120
    with pytest.raises(ValueError):
        parse_ranks(text)  # cut short: it no longer names every rank


@PROPS
@given(SETS)
def test_every_printed_form_parses_back_to_the_same_set(ranks: set[int]) -> None:
    want = sorted(ranks)
    assert parse_ranks(format_ranks(ranks)) == want
    assert parse_ranks(format_ranks(ranks, sep=", ", min_run=2)) == want
    assert parse_ranks(describe_ranks(ranks, limit=None)) == want


@PROPS
@given(SETS)
def test_the_printed_form_is_never_longer_than_the_list(ranks: set[int]) -> None:
    assert len(format_ranks(ranks)) <= len(",".join(map(str, sorted(ranks))))


@pytest.mark.parametrize("bad", ["1-", "5-3", "odd 2-8", "0-9 step 2", "x", "1,,2"])
def test_what_is_not_a_rank_set_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ranks(bad)


def test_dumps_diff_at_4096_ranks_prints_short_group_lines() -> None:
    """Issue 28 item 6 / 31: every rank number in every group line was tens of KB per line."""

    def dump(rank: int, fn: str) -> dict[str, Any]:
        frames = [
            {"name": fn, "filename": "/venv/site-packages/torch/distributed/distributed_c10d.py", "line": 9},
            {"name": "train_step", "filename": "/w/train.py", "line": 40 if rank % 2 else 41},
            {"name": "main", "filename": "/w/train.py", "line": 90},
        ]
        thread = {"thread_name": "MainThread", "frames": frames}
        return {"rank": rank, "pid": rank + 1, "ok": True, "threads": [thread]}

    ranks = {r: dump(r, "barrier" if r % 2 else "all_reduce") for r in range(4096)}
    text = format_diff(diff_incident(ranks))
    assert max(len(line) for line in text.splitlines()) < 400, text[:2000]
    assert "2,048 ranks: odd 1-4095" in text and "2,048 ranks: even 0-4094" in text


def test_ranks_without_a_dump_share_one_line_per_reason() -> None:
    failed = {r: {"rank": r, "ok": False, "error": "ptrace denied", "threads": []} for r in range(3000)}
    text = format_diff(diff_incident(failed))
    assert "ranks 0-2999 (3,000): no dump (ptrace denied)" in text and len(text) < 1000
