"""Across ranks: name the rank that failed or stopped first.

In synchronous training a rank that dies or hangs takes every peer down with it a
collective later, and the peers' logs fill with NCCL timeouts that point nowhere. The
useful answer is the rank whose own log holds the real error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from rankwatch.config.settings import opt, settings
from rankwatch.detectors.base import median
from rankwatch.errorkinds import OWN_FAILURES, PEER_FAILURES
from rankwatch.records import Finding, Severity
from rankwatch.state import RankState


@settings("detectors", "rank_lagging", "cross-rank lag")
@dataclass(frozen=True)
class RankLagConfig:
    enabled: bool = opt(True, "one rank stopped or lags while others carry on")
    min_lag_steps: int = opt(1, "steps behind the leading rank that count as lagging at the end")


@dataclass(frozen=True, slots=True)
class PeerFailure:
    """One rank's failure as the cross-rank judgement weighs it: from a finished log's
    findings (``analyze``) or from a live agent's record in the run folder (runtime/diagnose.py).

    ``time``: wall-clock seconds, when known; ``line``: its first line in ``path`` (a combined
    log orders the ranks' failures when no line carries a time); ``consequence``: what a rank
    says when a peer failed (a lost connection, a collective timeout), never a cause itself;
    ``exit``: a clean exit, the cause only of what waited for that rank."""

    rank: int | None
    time: float | None = None
    line: int | None = None
    path: str | None = None
    consequence: bool = False
    exit: bool = False


def first_failures(
    failures: Sequence[PeerFailure],
    *,
    of: PeerFailure | None = None,
    window: float | None = None,
    slack: float = 0.0,
) -> list[PeerFailure]:
    """The failures that may be the first failure, the first one first: the one judgement of
    "which rank failed first", for ``analyze`` and the live agent alike.

    A consequence is never the first failure. ``of``: the failure to explain: only other ranks'
    failures count, dated no later than it (``slack`` seconds later for a consequence, whose
    cause's record may be written after it) and no earlier than ``window`` seconds before it;
    a clean exit explains only a consequence (a rank that left is what its peers waited for,
    never the cause of a peer's own error). Order: by time when the failures carry one (those
    that do not are passed over), else by line within one file (``torchrun --tee``), else by
    rank."""
    out = [f for f in failures if not f.consequence]
    if of is not None:
        out = [f for f in out if f.rank != of.rank and (of.consequence or not f.exit)]
        if of.time is not None:
            late = of.time + (slack if of.consequence else 0.0)
            early = of.time - window if window is not None else None
            out = [
                f for f in out if f.time is None or ((early is None or early <= f.time) and f.time <= late)
            ]
    timed = [f for f in out if f.time is not None]
    if timed:
        return sorted(timed, key=lambda f: (f.time, f.rank is None, f.rank or 0))
    one_file = len({f.path for f in out}) == 1

    def order(f: PeerFailure) -> tuple[int, bool, int]:
        return (f.line if one_file and f.line is not None else 0, f.rank is None, f.rank or 0)

    return sorted(out, key=order)


def _first_time(findings: Sequence[Finding], kinds: tuple[str, ...]) -> tuple[bool, float | None, int | None]:
    hits = [f for f in findings if f.kind in kinds and not f.resolved]
    if not hits:
        return False, None, None
    times = [f.time for f in hits if f.time is not None]
    lines = [f.line for f in hits if f.line is not None]
    return True, (min(times) if times else None), (min(lines) if lines else None)


def _interval(state: RankState) -> int:
    steps = [r.step for r in state.recent_records(50) if r.step is not None]
    deltas = [b - a for a, b in pairwise(steps) if b > a]
    return int(median(deltas)) if deltas else 1


def _label(ranks: Sequence[int | None]) -> str:
    return ",".join(str(r) for r in ranks)


def cross_rank(
    states: Sequence[RankState], findings: dict[int | None, list[Finding]], cfg: RankLagConfig
) -> list[Finding]:
    if not cfg.enabled or len(states) < 2:
        return []
    out: dict[int | None, Finding] = {}
    by_rank = {s.rank: s for s in states}

    primary = {}
    secondary = []
    for s in states:
        fs = findings.get(s.rank, [])
        has_p, t_p, line_p = _first_time(fs, OWN_FAILURES)
        if has_p:
            primary[s.rank] = (t_p, line_p)
        if _first_time(fs, PEER_FAILURES)[0]:
            secondary.append(s.rank)

    if primary and secondary:
        own = [PeerFailure(r, t, line, by_rank[r].path) for r, (t, line) in primary.items()]
        culprit = first_failures(own)[0].rank
        st = by_rank[culprit]
        others = [r for r in secondary if r != culprit]
        if others:
            kinds = sorted({f.kind for f in findings.get(culprit, []) if f.kind in OWN_FAILURES})
            at = f" at step {st.last_step}" if st.last_step is not None else ""
            out[culprit] = Finding(
                kind="rank_lagging",
                severity=Severity.CRITICAL,
                rank=culprit,
                message=(
                    f"rank {culprit} failed first ({', '.join(kinds)}{at}); the collective "
                    f"timeouts/errors and lost peers on rank(s) {_label(others)} are a consequence. The "
                    f"real traceback is in rank {culprit}'s log ({st.path})."
                ),
                step=st.last_step,
                line=primary[culprit][1],
                path=st.path,
            )

    if len(secondary) >= 1 and not primary:
        silent = [s.rank for s in states if s.rank not in secondary]
        if len(silent) == 1 and len(secondary) >= len(states) - 1:
            r = silent[0]
            st = by_rank[r]
            out[r] = Finding(
                kind="rank_lagging",
                severity=Severity.CRITICAL,
                rank=r,
                message=(
                    f"rank {r} is the only rank without a collective timeout or lost peer: it never "
                    f"reached the collective the others waited in (ranks {_label(secondary)}), so it hung "
                    f"or died first (last step {st.last_step}). Look at rank {r}'s log and stack ({st.path})."
                ),
                step=st.last_step,
                path=st.path,
            )

    stepped = [s for s in states if s.last_step is not None]
    if len(stepped) >= 2:
        lead = max(stepped, key=lambda s: s.last_step or 0)
        slack = max(cfg.min_lag_steps, _interval(lead))
        lagging = [s for s in stepped if (s.last_step or 0) < (lead.last_step or 0) - slack]
        if lagging and len(lagging) * 2 < len(stepped):
            for s in lagging:
                if s.rank in out:
                    continue
                out[s.rank] = Finding(
                    kind="rank_lagging",
                    severity=Severity.WARNING,
                    rank=s.rank,
                    message=(
                        f"rank {s.rank} stopped at step {s.last_step} while rank {lead.rank} reached step "
                        f"{lead.last_step}: it stopped or fell behind first. The real error, if any, is in "
                        f"rank {s.rank}'s log ({s.path})."
                    ),
                    step=s.last_step,
                    path=s.path,
                )
    return list(out.values())
