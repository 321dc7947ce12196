"""``rankwatch checkpoints DIR``: which checkpoint can I resume from?

Exit 0 when the newest checkpoint is good, 1 when it is not (corrupt, incomplete,
suspect, or none at all, or a "latest" pointer leads nowhere), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch.checkpoints import CheckpointConfig

if TYPE_CHECKING:
    # Imported where used: every start of the agent builds the parser (``add_subcommands``),
    # and only this command needs the catalog, the layouts and their verifiers.
    from rankwatch.checkpoints import layouts as L
    from rankwatch.checkpoints.catalog import Catalog, Entry


def _when(t: float) -> str:
    if not t:
        return "-"
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _name(e: Entry, root: Path) -> str:
    return root.name if e.name == "." else e.name


def format_table(entries: list[Entry], root: Path) -> str:
    from rankwatch.events import human_size

    rows = [("NAME", "STEP", "SAVED (UTC)", "SIZE", "LAYOUT", "STATUS")]
    notes: dict[int, list[str]] = {}
    for e in entries:
        rows.append(
            (
                _name(e, root),
                "-" if e.step is None else str(e.step),
                _when(e.saved_at),
                human_size(e.size),
                e.layout,
                e.status_text(),
            )
        )
        if e.notes:
            notes[len(rows) - 1] = e.notes
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for i, r in enumerate(rows):
        cells = [r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].ljust(widths[2]), r[3].rjust(widths[3])]
        lines.append("  ".join([*cells, r[4].ljust(widths[4]), r[5]]).rstrip())
        lines.extend(f"    note: {n}" for n in notes.get(i, []))
    return "\n".join(lines)


def inspect(root: Path, cfg: CheckpointConfig, bad_from: int | None = None) -> tuple[Catalog, L.ScanResult]:
    from rankwatch.checkpoints import layouts as L
    from rankwatch.checkpoints.catalog import Catalog

    catalog = Catalog(root, cfg, oneshot=True)
    scan = L.scan(root, glob=cfg.glob, step_regex=cfg.step_regex, max_depth=cfg.max_depth)
    catalog.update(scan)
    if bad_from is not None:
        catalog.mark_bad_from(bad_from, "--bad-from")
    return catalog, scan


def newest_settled(entries: list[Entry]) -> Entry | None:
    from rankwatch.checkpoints.catalog import WRITING

    return next((e for e in reversed(entries) if e.status != WRITING), None)


def cmd_checkpoints(args: argparse.Namespace) -> int:
    from rankwatch.checkpoints.catalog import GOOD, WRITING
    from rankwatch.events import last_good_line

    root = Path(args.dir)
    if not root.exists():
        print(f"rankwatch checkpoints: {root}: no such file or directory", file=sys.stderr)
        return 2
    if args.step_regex:
        try:
            re.compile(args.step_regex)
        except re.error as e:
            print(f"rankwatch checkpoints: --step-regex: {e}", file=sys.stderr)
            return 2
    cfg = CheckpointConfig(
        dir=str(root),
        glob=args.glob,
        step_regex=args.step_regex,
        max_depth=args.max_depth,
        deep=args.deep or bool(args.manifest),
        manifest=args.manifest,
        **({"settle": args.settle} if args.settle is not None else {}),
    )
    catalog, scan = inspect(root, cfg, args.bad_from)
    entries = catalog.ordered()
    good = catalog.last_good()
    newest = newest_settled(entries)
    broken = catalog.broken_pointers()
    ok = newest is not None and newest.status == GOOD and not broken
    now = time.time()
    if args.json:
        doc: dict[str, Any] = {
            "dir": str(root),
            "checkpoints": [e.to_json() for e in entries],
            "last_good": good.to_json() if good else None,
            "newest_is_good": ok,
            "pointers": [{"file": p.file, "value": p.value, "exists": p.exists} for p in scan.pointers],
            "poisoned_from_step": catalog.bad.step if catalog.bad else None,
        }
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0 if ok else 1
    if not entries:
        print(f"no checkpoints found under {root}")
        return 1
    print(format_table(entries, root))
    for p in broken:
        print(f"{p.file} points at {p.value!r}: {p.target} does not exist (resume will fail)")
    writing = [e for e in entries if e.status == WRITING]
    if writing:
        print(f"being written: {', '.join(_name(e, root) for e in writing)}")
    print(last_good_line(good.saved() if good is not None else None, now))
    return 0 if ok else 1


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``checkpoints`` on the main CLI's subparsers."""
    p = sub.add_parser(
        "checkpoints",
        help="list checkpoints, verify them and name the last good one",
        description="List the checkpoints under DIR oldest to newest (Hugging Face checkpoint-N, Lightning "
        ".ckpt, torch.distributed.checkpoint, Megatron iter_N, DeepSpeed global_stepN, plain "
        ".pt/.safetensors), "
        "verify each without loading tensors, and name the last good one: intact and saved before the run's "
        "first NaN. Exit 0: the newest checkpoint is good; 1: it is not; 2: bad usage.",
    )
    p.add_argument("dir", metavar="DIR", help="checkpoint directory (or one checkpoint)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--deep", action="store_true", help="also sha256 and CRC-check every byte (slow)")
    p.add_argument(
        "--manifest", metavar="FILE", help="sha256 manifest to compare with and update (implies --deep)"
    )
    p.add_argument("--glob", help="extra checkpoints: glob relative to DIR")
    p.add_argument("--step-regex", help="regex whose first group is the step, applied to names")
    p.add_argument("--max-depth", type=int, default=3, help="folder levels searched below DIR (default 3)")
    p.add_argument("--settle", type=float, help="seconds since the last write before a save counts as done")
    p.add_argument(
        "--bad-from", type=int, metavar="STEP", help="the run's first NaN step: later checkpoints are suspect"
    )
    p.set_defaults(func=cmd_checkpoints)
