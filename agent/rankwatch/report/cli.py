"""``rankwatch report INCIDENT``: the incident as one HTML page, or a few Markdown lines."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rankwatch.dumps.cli import _common, _find, _store


def cmd_report(args: argparse.Namespace) -> int:
    # Here, not at the top: the agent builds this parser at every start and renders no report.
    from rankwatch.report.html import render_html
    from rankwatch.report.markdown import render_markdown
    from rankwatch.report.model import build_report, read_findings

    store = _store(args)
    info = _find(store, args)
    if info is None:
        return 1
    findings = None
    if args.findings:
        findings = read_findings(args.findings, info.run, info.time.timestamp())
    rep = build_report(
        store, info, findings=findings, findings_source=args.findings, world_size=args.world_size
    )
    if not rep.ranks:
        print(f"rankwatch report: incident {info.name} holds no rank dumps or traces", file=sys.stderr)
        return 1
    if args.format == "markdown":
        text = render_markdown(rep, url=args.url)
    else:
        out_dir = Path(args.output).resolve().parent if args.output and args.output != "-" else None

        def link(rank: int) -> str:
            target = info.path / f"rank-{rank}.txt"
            if out_dir is None:
                return target.resolve().as_uri()
            return os.path.relpath(target, out_dir)

        text = render_html(rep, link=link)
    if not args.output or args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"report: {args.output}", file=sys.stderr)
    return 0


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report",
        help="one incident as one page: verdict, timeline, merged stacks, evidence",
        description="Read an incident folder (the stacks of every rank, the run's failure records, the "
        "Flight Recorder traces) and write one self-contained HTML page (no network), or with "
        "--format markdown a few lines to paste into Slack or a ticket.",
    )
    p.add_argument("incident", help="incident name, unique prefix, run/name or folder path")
    p.add_argument("--run", help="the run the incident belongs to, when its name alone is ambiguous")
    p.add_argument(
        "--format", choices=("html", "markdown"), default="html", help="html (default) or markdown"
    )
    p.add_argument("-o", "--output", help="write to this file (default: stdout)")
    p.add_argument("--findings", metavar="FILE", help="a findings JSONL file (--findings-jsonl) to show from")
    p.add_argument("--world-size", type=int, help="the job's world size, when the dumps do not record it")
    p.add_argument("--url", help="the report's address, for the Markdown's link line")
    _common(p)
    p.set_defaults(func=cmd_report)
