"""The alert policy alone: plain calls on a fake clock, no event loop, no sinks, no files."""

from __future__ import annotations

import pytest

from rankwatch.actions.alerts.message import AlertMessage
from rankwatch.actions.alerts.policy import AlertPolicy
from rankwatch.config.schema import AlertsConfig
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity

pytestmark = pytest.mark.unit

IDENT = Identity(run="job", rank=0, local_rank=0, world_size=4, node="n")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def policy(**kw: float) -> tuple[AlertPolicy, list[AlertMessage], Clock]:
    out: list[AlertMessage] = []
    clock = Clock()
    cfg = AlertsConfig(**{"startup_quiet": 0.0, "group_wait": 5.0, "repeat_interval": 0.0, **kw})
    p = AlertPolicy(cfg, IDENT, out.append, clock=clock, wall=clock)
    p.restart([], None, {})
    p.start(clock())
    return p, out, clock


def stall(rank: int, *, resolved: bool = False) -> Finding:
    return Finding("stall", Severity.CRITICAL, rank, "ok" if resolved else "stuck", 5, resolved=resolved)


def test_grouping_dedup_and_resolve_are_plain_calls() -> None:
    p, out, clock = policy()
    for r in range(4):
        p.take(stall(r))
    p.take(stall(1))  # a second firing of an active alert: nothing new
    assert p.pump(clock()) == clock() + 5.0 and out == []
    clock.t += 5.0
    p.pump(clock())
    assert [(m.status, m.ranks, m.title) for m in out] == [("firing", [0, 1, 2, 3], "stall on 4 of 4 ranks")]
    p.take(stall(2, resolved=True))
    clock.t += 5.0
    p.pump(clock())
    assert [(m.status, m.ranks) for m in out[1:]] == [("resolved", [2])]


def test_flap_within_group_wait_is_silent_and_startup_quiet_holds() -> None:
    p, out, clock = policy(startup_quiet=60.0)
    p.take(stall(0))
    p.take(stall(0, resolved=True))
    p.take(stall(3))
    clock.t += 10.0
    assert p.pump(clock()) == 1060.0 and out == []  # held by the quiet window, not dropped
    clock.t = 1060.0
    p.pump(clock())
    assert [m.ranks for m in out] == [[3]]


def test_repeat_interval_resends_what_is_still_firing() -> None:
    p, out, clock = policy(group_wait=0.0, repeat_interval=100.0)
    p.take(stall(1))
    p.pump(clock())
    clock.t += 100.0
    assert p.pump(clock()) == clock() + 100.0
    assert [m.title for m in out] == ["stall on rank 1", "still firing: stall on rank 1"]
