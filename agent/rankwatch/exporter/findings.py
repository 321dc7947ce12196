"""Finding counters and the set of active findings, caught up at read time.

``Agent.findings`` is an append-only log that the agent trims from the front (it keeps
the last few thousand). A counter must never go down, so the tracker remembers the last
finding it counted (by identity) and, on each snapshot, counts only what came after it.
The emit path of the agent stays untouched. The runtime keeps one tracker per agent and
puts its counts in every snapshot, so the metrics and the JSON API share one count.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rankwatch.exporter.collector import register
from rankwatch.records import Finding
from rankwatch.snapshot import RANK_LABELS, AgentSnapshot, CountKey, RankLabels

FindingKey = tuple[str, int | None, str | None]  # Finding.key: (kind, rank, subject)


class FindingTracker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: Finding | None = None
        self._pos = 0
        self.counts: Counter[CountKey] = Counter()
        self._active: dict[FindingKey, Finding] = {}
        self.seen_active: set[CountKey] = set()

    def _start(self, findings: Sequence[Finding]) -> int:
        last, n = self._last, len(findings)
        if last is None:
            return 0
        if 0 < self._pos <= n and findings[self._pos - 1] is last:
            return self._pos
        for i in range(n - 1, -1, -1):
            if findings[i] is last:
                return i + 1
        return 0  # trimmed away: everything still there came after it

    def update(self, findings: Sequence[Finding]) -> None:
        with self._lock:
            n = len(findings)
            start = self._start(findings)
            for f in findings[start:n] if start < n else ():
                if f.resolved:
                    self._active.pop(f.key, None)
                    continue
                sev = f.severity.label
                self.counts[(f.rank, f.kind, sev)] += 1
                self._active.pop(f.key, None)  # re-insert: dict order is then newest last
                self._active[f.key] = f
                self.seen_active.add((f.rank, f.kind, sev))
            if n:
                self._last, self._pos = findings[n - 1], n

    def active(self) -> list[Finding]:
        """Fired and not resolved since, newest first."""
        with self._lock:
            return list(reversed(self._active.values()))

    def snapshot(self) -> tuple[Counter[CountKey], Counter[CountKey]]:
        """(fired totals, active now); active includes a 0 for every key ever active, so a
        resolved alert drops to 0 instead of vanishing."""
        with self._lock:
            totals = Counter(self.counts)
            active: Counter[CountKey] = Counter(dict.fromkeys(self.seen_active, 0))
            for f in self._active.values():
                active[(f.rank, f.kind, f.severity.label)] += 1
        return totals, active


@register("findings")
def collect_findings(snap: AgentSnapshot, failures: Mapping[str, int]) -> list[Metric]:
    snap.need("findings")
    labels_by_rank = snap.labels_for_rank()
    totals, active = snap.findings.totals, snap.findings.active_counts
    extra = ["kind", "severity"]
    fired = CounterMetricFamily(
        "rankwatch_findings_total",
        "Findings fired since the agent started (resolutions are not counted)",
        labels=[*RANK_LABELS, *extra],
    )
    now = GaugeMetricFamily(
        "rankwatch_active_findings",
        "Findings fired and not resolved since (0 after a resolution)",
        labels=[*RANK_LABELS, *extra],
    )

    def labels(rank: int | None) -> list[str]:
        got: RankLabels | None = labels_by_rank.get(rank)
        if got is None:  # a rank no watcher knows: the agent's run and node
            run, _, _, node = snap.labels
            got = (run, "" if rank is None else str(rank), "", node)
        return list(got)

    for (rank, kind, sev), n in sorted(totals.items(), key=_order):
        fired.add_metric([*labels(rank), kind, sev], n)
    for (rank, kind, sev), n in sorted(active.items(), key=_order):
        now.add_metric([*labels(rank), kind, sev], n)
    return [fired, now]


def _order(item: tuple[CountKey, int]) -> tuple[int, str, str]:
    (rank, kind, sev), _ = item
    return (-1 if rank is None else rank, kind, sev)
