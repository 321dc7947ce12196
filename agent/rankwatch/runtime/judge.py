"""The cross-rank diagnosis as the services wire it: made when there are peers to judge.

``runtime/diagnose.py`` (its stall diffs, first failures, profiles, run folder) does nothing
for an agent that watches one rank of a job of one: both its hooks return at once. So the
agent gets this stand-in, which builds the real one (and imports its module, ~0.2 MB) when it
is wired to an agent that watches ranks of a job of more than one, or else the first time a
hook is called once it does (a launcher's workers attached after the start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rankwatch.errorkinds import PEER_FAILURE_RE, RECORDED_FAILURES
from rankwatch.records import FirstFailure
from rankwatch.runtime.agent import multi_rank

if TYPE_CHECKING:
    from pathlib import Path

    from rankwatch.config.schema import Config
    from rankwatch.records import Finding
    from rankwatch.runtime.agent import CrossRankJudge


class CrossRankWhenPeers:
    """A ``CrossRankJudge`` that is the real one (``diagnose.CrossRank``) once there are peers."""

    def __init__(self, agent: Any, cfg: Config) -> None:
        self.agent = agent
        self.cfg = cfg
        self.judge: CrossRankJudge | None = None
        self._firsts: dict[tuple[str | None, float | None], int] = {}  # (run, job start) -> rank
        self._made()  # at once for a job of many known at the start, as the services made it

    def _made(self) -> CrossRankJudge | None:
        if self.judge is None and multi_rank(self.agent):
            from rankwatch.runtime.diagnose import CrossRank

            self.judge = CrossRank(self.agent, self.cfg)
        return self.judge

    def hold(self, f: Finding) -> bool:
        judge = self._made()
        if judge is None:
            self._first_in_one_log(f)
            return False
        return judge.hold(f)

    def _first_in_one_log(self, f: Finding) -> None:
        """One pipeline whose log tells of ranks that are not its own (a script that starts its
        ranks itself, ``torch.multiprocessing.spawn``: its workers set RANK inside themselves,
        so no process shows one): its log is the whole job's, in the order things happened. The
        first failure of a rank of its own (not a peer's lost connection, not a stop) is the
        job's first failure and its suspect; a later one follows it and names nobody."""
        if (
            f.rank is None
            or f.resolved
            or f.diagnosis is not None
            or f.kind not in RECORDED_FAILURES
            or f.rank in {self.agent.identity.rank, *(w.rank for w in self.agent.watchers)}
        ):
            return
        text = " ".join([f.message, *[str(x) for x in f.evidence.get("traceback") or []][-5:]])
        if PEER_FAILURE_RE.search(text) or f.evidence.get("stopped_by"):
            return
        key = (f.run or self.agent.identity.run, self._job_start(f))
        if key in self._firsts:
            return
        if len(self._firsts) >= 64:
            self._firsts.pop(next(iter(self._firsts)))
        self._firsts[key] = f.rank
        how = f.message.split(". ")[0].strip().rstrip(".")[:300]
        first = FirstFailure(f.rank, f.kind, f.time, how, f.path[:1000] if f.path else None)
        f.diagnosed(suspects=(f.rank,), first_failure=first)

    def _job_start(self, f: Finding) -> float | None:
        """When the process of ``f``'s pipeline started: a new job's first failure is its own."""
        starts = [
            float(started)
            for w in self.agent.watchers
            if (f.run is None or w.identity.run == f.run)
            and isinstance(started := getattr(w.prober, "started", None), (int, float))
        ]
        return min(starts) if starts else None

    def clean_exit(self, rank: int | None, step: int | None, t: float, run: str | None = None) -> None:
        judge = self._made()
        if judge is not None:
            judge.clean_exit(rank, step, t, run)

    async def launcher_workers(self, f: Finding, folder: Path) -> bool:
        # One pipeline that stands for a launcher's workers (torch.multiprocessing.spawn) has
        # peers only its stacks show: judged at its stall, so the real one is made then.
        if self.judge is None:
            from rankwatch.runtime.diagnose import CrossRank

            self.judge = CrossRank(self.agent, self.cfg)
        return await self.judge.launcher_workers(f, folder)
