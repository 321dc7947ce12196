"""The one judgement of "which rank failed first" (detectors/crossrank.first_failures), as
``analyze`` and the live agent (runtime/diagnose.py) both use it."""

from __future__ import annotations

import pytest

from rankwatch.detectors.crossrank import PeerFailure, first_failures

pytestmark = pytest.mark.unit


def ranks(fs: list[PeerFailure]) -> list[int | None]:
    return [f.rank for f in fs]


def test_the_earliest_failure_is_first_and_consequences_never_are() -> None:
    fs = [
        PeerFailure(0, 105.0, consequence=True),  # rank 0's gloo error: a consequence
        PeerFailure(2, 103.0),
        PeerFailure(1, 101.0),
    ]
    assert ranks(first_failures(fs)) == [1, 2]


def test_a_failure_is_explained_only_by_other_ranks_earlier_failures() -> None:
    fs = [PeerFailure(0, 100.0), PeerFailure(1, 110.0), PeerFailure(2, 120.0)]
    assert ranks(first_failures(fs, of=PeerFailure(1, 110.0))) == [0]  # not itself, not later
    assert ranks(first_failures(fs, of=PeerFailure(0, 100.0))) == []  # rank 0 is the first failure
    # A consequence's cause may be recorded a little after it (its agent was slower).
    assert ranks(first_failures(fs, of=PeerFailure(3, 115.0, consequence=True), slack=30.0)) == [0, 1, 2]
    # Older than the window: another incident.
    assert ranks(first_failures(fs, of=PeerFailure(3, 715.0), window=600.0)) == [2]


def test_a_clean_exit_explains_only_what_waited_for_it() -> None:
    left = PeerFailure(1, 100.0, exit=True)
    assert ranks(first_failures([left], of=PeerFailure(0, 105.0, consequence=True))) == [1]
    assert ranks(first_failures([left], of=PeerFailure(0, 105.0))) == []  # its own error: not rank 1's doing


def test_without_times_the_earlier_line_of_one_combined_log_is_first() -> None:
    tee = [PeerFailure(0, None, 40, "job.log"), PeerFailure(1, None, 12, "job.log")]
    assert ranks(first_failures(tee)) == [1, 0]
    # Lines of different files say nothing of order: rank order.
    files = [PeerFailure(1, None, 12, "rank-1.log"), PeerFailure(0, None, 40, "rank-0.log")]
    assert ranks(first_failures(files)) == [0, 1]
    # Failures with a time win over those without.
    assert ranks(first_failures([*tee, PeerFailure(2, 50.0)])) == [2]


def test_analyze_and_the_live_agent_share_the_judgement() -> None:
    """Both paths call the one function (no second copy of the rule to drift)."""
    import inspect

    from rankwatch.detectors import crossrank
    from rankwatch.runtime import diagnose

    assert diagnose.first_failures is crossrank.first_failures
    assert "first_failures(" in inspect.getsource(crossrank.cross_rank)
    assert "first_failures(" in inspect.getsource(diagnose.CrossRank._first_failure)
