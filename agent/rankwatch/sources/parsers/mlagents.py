"""Unity ML-Agents (``mlagents-learn``): its console summary, one per ``summary_freq`` steps.

``ConsoleWriter.write_stats`` (mlagents/trainers/stats.py) joins its parts with ``". "``:
``3DBall. Step: 12000. Time Elapsed: 15.112 s. Mean Reward: 1.173. Std of Reward: 0.705.
Training.`` (0.x releases: ``INFO:mlagents.trainers: run: 3DBall: Step: 15000. Time Elapsed:
80.900 s Mean Reward: 0.333. Std of Reward: 0.471. Training.``; with no episode ended since the
last summary, ``No episode was completed since last summary`` instead of the rewards). The step
is the trainer's count of environment steps. It prints no loss, and a mean reward is no loss (it
should rise, and it swings with the episodes), so a summary is the run's progress only.
"""

from __future__ import annotations

import re
from typing import ClassVar

from rankwatch.records import Record

from ._common import step_record, strip_ansi
from .base import LogLine
from .registry import register_parser

_SUMMARY = re.compile(r"\bStep: (?P<s>\d{1,15})\. Time Elapsed: \d{1,12}(?:\.\d{1,6})? s\b")


@register_parser
class MlAgentsParser:
    name: ClassVar[str] = "mlagents"
    hints: ClassVar[tuple[str, ...]] = ("Time Elapsed: ",)  # a line sniff() accepts holds one
    generic: ClassVar[bool] = False
    order: ClassVar[int] = 100  # sniffed after smaller orders (registry.py)

    def sniff(self, text: str) -> bool:
        return "Time Elapsed: " in text and _SUMMARY.search(strip_ansi(text)) is not None

    def parse(self, line: LogLine) -> list[Record]:
        text = line.text
        if "Time Elapsed: " not in text:
            return []
        m = _SUMMARY.search(strip_ansi(text))
        if m is None:
            return []
        return [step_record(line, step=int(m["s"]))]
