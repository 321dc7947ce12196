"""The ``rankwatch`` command: argument parsing and wiring, nothing else.

Subcommand modules are imported only when used so ``rankwatch --help`` stays instant.
Exit codes: 0 fine, 1 findings (analyze) or failure, 2 bad usage, bad config or bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rankwatch import __version__

LOG_SUFFIXES = (".log", ".out", ".err", ".txt", ".csv", ".jsonl")


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit 2."""


def _setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    if not verbose and not quiet:
        level = logging.WARNING
    logging.basicConfig(
        level=level, format="rankwatch %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def _load_config(args: argparse.Namespace):
    from rankwatch.config.loader import load_config, with_overrides

    path = getattr(args, "config", None) or os.environ.get("RANKWATCH_CONFIG") or None
    cfg = load_config(path)
    overrides: dict[str, object] = {}
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. detectors.warmup_steps=50")
        overrides[key.strip()] = value
    if getattr(args, "format", None):
        overrides["logs.format"] = args.format
    if overrides:
        cfg = with_overrides(cfg, overrides)
    return cfg


def _expand_paths(paths: Sequence[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix in LOG_SUFFIXES)
            if not files:
                raise UsageError(f"{p}: directory holds no log files ({', '.join(LOG_SUFFIXES)})")
            out.extend(str(f) for f in files)
        elif path.is_file():
            out.append(str(path))
        elif path.exists():
            raise UsageError(f"{p}: not a regular file")
        else:
            raise UsageError(f"{p}: no such file")
        for f in out[-1:]:
            if not os.access(f, os.R_OK):
                raise UsageError(f"{f}: permission denied")
    return out


def cmd_analyze(args: argparse.Namespace) -> int:
    from rankwatch.analyze import analyze, format_human

    cfg = _load_config(args)
    paths = _expand_paths(args.paths)
    result = analyze(paths, cfg)
    if args.json:
        json.dump(
            result.to_json(), sys.stdout, indent=2 if args.pretty else None, allow_nan=False, default=str
        )
        sys.stdout.write("\n")
    else:
        colour = sys.stdout.isatty() and not args.no_color and "NO_COLOR" not in os.environ
        print(format_human(result, colour=colour))
    return result.exit_code()


def cmd_config_show(args: argparse.Namespace) -> int:
    from rankwatch.config.render import render_config

    sys.stdout.write(render_config(_load_config(args)))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from rankwatch.config.loader import load_config

    load_config(args.file)
    print(f"{args.file}: ok")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rankwatch",
        description="Watches every rank of a distributed training job from outside its process: "
        "NaN and diverging loss, slowdowns, crashes, hangs (with py-spy dumps), metrics and alerts.",
    )
    p.add_argument("--version", action="version", version=f"rankwatch {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", "-c", metavar="FILE", help="YAML config (default: $RANKWATCH_CONFIG)")
    common.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override one config key, e.g. detectors.warmup_steps=50",
    )

    a = sub.add_parser(
        "analyze",
        parents=[common],
        help="run the parsers and detectors over finished log files (one per rank)",
        description="Analyze finished logs. Rank comes from the file name (rank-3.log) or from launcher "
        "prefixes on each line. Exit 0: nothing of severity warning or above; 1: such findings; "
        "2: bad input.",
    )
    a.add_argument("paths", nargs="+", metavar="PATH", help="log files, or directories of them")
    a.add_argument("--json", action="store_true", help="print one JSON document (the DESIGN.md contract)")
    a.add_argument("--pretty", action="store_true", help="indent the JSON")
    a.add_argument("--format", help="force a log format instead of auto-detection")
    a.add_argument("--no-color", action="store_true", help="no ANSI colour in the summary")
    a.set_defaults(func=cmd_analyze)

    c = sub.add_parser("config", help="show the effective configuration or check a file")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    cs = csub.add_parser("show", parents=[common], help="print the effective config with defaults and docs")
    cs.set_defaults(func=cmd_config_show)
    cc = csub.add_parser("check", help="validate a config file (exit 2 with file:line: key on error)")
    cc.add_argument("file")
    cc.set_defaults(func=cmd_config_check)

    try:
        from rankwatch.dumps.cli import add_subcommands
    except ImportError:  # pragma: no cover - the dumps package ships with rankwatch
        pass
    else:
        add_subcommands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.quiet)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from rankwatch.config.loader import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"rankwatch: config error: {e}", file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"rankwatch: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
