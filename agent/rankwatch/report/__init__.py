"""One incident, one page: the verdict, a timeline, the merged stacks and the evidence.

``build_report`` reads an incident folder through the dump store into a ``Report``;
``render_html`` and ``render_markdown`` draw it. The CLI (``rankwatch report``) and the
status page's ``/incidents/<id>`` share both.

Its modules are imported on first use (``rankwatch.report.render_html`` and the rest are
looked up lazily): an agent that never renders a report does not load them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankwatch.report.html import render_html
    from rankwatch.report.markdown import render_markdown
    from rankwatch.report.model import Report, build_report, verdict_lines

_WHERE = {
    "render_html": "html",
    "render_markdown": "markdown",
    "Report": "model",
    "build_report": "model",
    "verdict_lines": "model",
}
__all__ = ["Report", "build_report", "render_html", "render_markdown", "verdict_lines"]


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{where}"), name)
