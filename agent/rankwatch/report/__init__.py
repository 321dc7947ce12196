"""One incident, one page: the verdict, a timeline, the merged stacks and the evidence.

``build_report`` reads an incident folder through the dump store into a ``Report``;
``render_html`` and ``render_markdown`` draw it. The CLI (``rankwatch report``) and the
status page's ``/incidents/<id>`` share both.
"""

from rankwatch.report.html import render_html
from rankwatch.report.markdown import render_markdown
from rankwatch.report.model import Report, build_report, verdict_lines

__all__ = ["Report", "build_report", "render_html", "render_markdown", "verdict_lines"]
