"""The cross-rank diagnosis as the services wire it: made when there are peers to judge.

``runtime/diagnose.py`` (its stall diffs, first failures, profiles, run folder) does nothing
for an agent that watches one rank of a job of one: both its hooks return at once. So the
agent gets this stand-in, which builds the real one (and imports its module, ~0.2 MB) when it
is wired to an agent that watches ranks of a job of more than one, or else the first time a
hook is called once it does (a launcher's workers attached after the start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
        self._made()  # at once for a job of many known at the start, as the services made it

    def _made(self) -> CrossRankJudge | None:
        if self.judge is None and multi_rank(self.agent):
            from rankwatch.runtime.diagnose import CrossRank

            self.judge = CrossRank(self.agent, self.cfg)
        return self.judge

    def hold(self, f: Finding) -> bool:
        judge = self._made()
        return judge.hold(f) if judge is not None else False

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
