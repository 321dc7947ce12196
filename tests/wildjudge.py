"""Judge analyze's output on a wild case against the human judgement written before it ran.

One function, used by ``tests/test_wild.py`` (every case must agree) and, as a script, to
take the **first-seen score** of a new batch before any code is changed for it::

    python tests/wildjudge.py tests/data/wild/batch2          # score, one line per case
    python tests/wildjudge.py tests/data/wild                  # the first corpus

The score is the share of cases on which analyze agrees with the judgement in full (format,
step counts, findings expected, forbidden and bounded). ``pending`` cases count as misses.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from rankwatch.analyze import Analysis, analyze
from rankwatch.config.schema import Config
from rankwatch.records import Finding, Severity

WILD = Path(__file__).resolve().parent / "data" / "wild"


def batches() -> list[Path]:
    """The first corpus (``wild/cases.yaml``) and every batch folder after it (``wild/batch*/``)."""
    return [WILD, *sorted(p for p in WILD.glob("batch*") if (p / "cases.yaml").is_file())]


def load(folder: Path) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = yaml.safe_load((folder / "cases.yaml").read_text()) or []
    for c in cases:
        c["_dir"] = str(folder)
    return cases


def all_cases() -> list[dict[str, Any]]:
    return [c for b in batches() for c in load(b)]


def path_of(case: dict[str, Any]) -> Path:
    return Path(case["_dir"]) / case["file"]


def run(case: dict[str, Any]) -> Analysis:
    return analyze([str(path_of(case))], Config(), jobs=1)


def serious(result: Analysis) -> list[Finding]:
    return [f for f in result.findings if f.severity >= Severity.WARNING]


def matches(f: Finding, want: dict[str, Any]) -> bool:
    kinds = want.get("kinds") or [want["kind"]]
    if f.kind not in kinds or f.severity < Severity.WARNING:
        return False
    if "step" in want and f.step != want["step"]:
        return False
    if "step_in" in want:
        lo, hi = want["step_in"]
        if f.step is None or not lo <= f.step <= hi:
            return False
    if "line" in want and f.line != want["line"]:
        return False
    return not ("rank" in want and f.rank != want["rank"])


def describe(result: Analysis) -> str:
    rows = [
        f"{r.path} rank={r.rank} format={r.format} steps={r.steps} last={r.last_step}" for r in result.ranks
    ]
    rows += [
        f"  {f.severity.label} {f.kind} rank={f.rank} step={f.step} line={f.line}: {f.message[:120]}"
        for f in result.findings
    ]
    return "\n".join(rows)


def disagreements(case: dict[str, Any], result: Analysis) -> list[str]:
    """Every way ``result`` differs from the case's judgement; empty when they agree."""
    out: list[str] = []
    if not result.recognised_any:
        out.append("nothing recognised")
    formats = {r.format for r in result.ranks}
    want_fmt = case["format"]
    allowed = set(want_fmt) if isinstance(want_fmt, list) else {want_fmt}
    if "format_any" not in case and not formats <= allowed:
        out.append(f"format {sorted(map(str, formats))} not in {sorted(map(str, allowed))}")
    steps = sum(r.steps for r in result.ranks)
    if "steps" in case and steps != case["steps"]:
        out.append(f"steps {steps} != {case['steps']}")
    if "last_step" in case:
        last = max((r.last_step for r in result.ranks if r.last_step is not None), default=None)
        if last != case["last_step"]:
            out.append(f"last_step {last} != {case['last_step']}")
    if "total_steps" in case:
        totals = {r.total_steps for r in result.ranks if r.steps}
        if totals != {case["total_steps"]}:
            out.append(f"total_steps {totals} != {case['total_steps']}")
    found = serious(result)
    if case["verdict"] == "healthy":
        out += [f"false alarm: {f.kind} rank={f.rank} step={f.step}" for f in found]
        return out
    if not found:
        out.append("no finding of warning or above")
    for want in case.get("expect", []):
        ranks = want.get("ranks")
        if ranks is None:
            if not any(matches(f, want) for f in found):
                out.append(f"missing {want}")
            continue
        out += [
            f"missing {want} on rank {r}"
            for r in ranks
            if not any(matches(f, {**want, "rank": r}) for f in found)
        ]
    out += [f"forbidden {k}" for k in case.get("forbid", []) if any(f.kind == k for f in found)]
    for kind, n in case.get("at_most", {}).items():
        if sum(f.kind == kind for f in result.findings) > n:
            out.append(f"more than {n} {kind}")
    out += [f"rank {r} named" for r in case.get("not_ranks", []) if any(f.rank == r for f in found)]
    return out


def main(argv: list[str]) -> int:
    folders = [Path(a) for a in argv] or batches()
    right = total = 0
    for folder in folders:
        for case in load(folder):
            total += 1
            bad = disagreements(case, run(case))
            right += not bad
            print(
                f"{'ok  ' if not bad else 'MISS'} {case['file']}" + ("" if not bad else f": {'; '.join(bad)}")
            )
    print(f"score: {right}/{total} = {right / max(total, 1):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
