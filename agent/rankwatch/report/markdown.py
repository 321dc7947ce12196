"""The incident report as a few Markdown lines: short enough to paste into Slack or a ticket.

The verdict and the lines that carry it, each escaped (``escape.md``): a frame name or a log
line cannot become a link, a heading or a mention, and controls are shown, not obeyed.
"""

from __future__ import annotations

import re

from rankwatch.ranksets import describe_ranks
from rankwatch.report.escape import md
from rankwatch.report.model import Report, utc, verdict_lines

MAX_LINES = 8
MAX_LINE = 400


def _cut(text: str) -> str:
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


def render_markdown(rep: Report, *, url: str | None = None) -> str:
    v = rep.verdict
    world = f" of {rep.world_size:,}" if rep.world_size else ""
    head = (
        f"**{md(rep.reason)} in run {md(rep.run)}** at {md(utc(rep.time, date=True))} "
        f"({len(rep.ranks):,} ranks{world})"
    )
    lines = [head, f"**Verdict: {md(_cut(v.headline))}**"]
    for text in verdict_lines(rep, limit=MAX_LINES):
        if text == v.headline:
            continue
        lines.append(f"- {md(_cut(text))}")
    if v.first_failure is None and v.suspects:
        lines.append("- first failure across ranks: none recorded")
    suspect_row = next((r for r in rep.rows if set(v.suspects) & set(r.ranks)), None)
    if suspect_row is not None and suspect_row.last_step is not None:
        lines.append(f"- {md(describe_ranks(v.suspects))} last step: {suspect_row.last_step}")
    if url is not None and re.fullmatch(r"https?://[^\s<>]+", url):
        lines.append(f"Report: <{url}>")
    else:
        lines.append(f"Report: {md(url or rep.path)}")
    return "\n".join(lines) + "\n"
