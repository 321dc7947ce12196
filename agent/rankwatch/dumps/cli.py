"""``rankwatch dumps ...``: list, show, diff and capture incident dumps.

Handlers return exit codes (0 ok, 1 nothing found or a capture failed, 2 bad usage) so the
main CLI can ``return args.func(args)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch import ranksets
from rankwatch.dumps.capture import capture
from rankwatch.dumps.diff import diff_incident, format_diff
from rankwatch.dumps.show import format_rank
from rankwatch.dumps.store import DumpStore, IncidentInfo, incident_name
from rankwatch.sanitize import visible, visible_lines

if TYPE_CHECKING:
    from rankwatch.config.schema import Config

DEFAULT_DIR = "rankwatch-dumps"


def default_dir() -> Path:
    return Path(os.environ.get("RANKWATCH_DUMPS_DIR") or DEFAULT_DIR)


def _store(args: argparse.Namespace) -> DumpStore:
    """--dir, else $RANKWATCH_DUMPS_DIR, else the agents' config (--config or $RANKWATCH_CONFIG)
    dumps.dir: the folder the agents wrote to, without retyping it."""
    if args.dir:
        return DumpStore(Path(args.dir))
    if os.environ.get("RANKWATCH_DUMPS_DIR"):
        return DumpStore(default_dir())
    cfg = _config(args)
    return DumpStore(Path(cfg.dumps.dir) if cfg is not None else default_dir())


def _config(args: argparse.Namespace) -> Config | None:
    """The agents' config, for its dumps.dir and run name. One given with --config must load
    (exit 2 otherwise); one only named by $RANKWATCH_CONFIG may need variables this shell
    lacks (the Slack token): then the defaults, with a note."""
    from rankwatch.config.loader import ConfigError, load_config

    given = getattr(args, "config", None)
    path = given or os.environ.get("RANKWATCH_CONFIG")
    if not path:
        return None
    try:
        return load_config(path)
    except ConfigError as e:
        if given:
            raise
        print(f"rankwatch dumps: ignoring $RANKWATCH_CONFIG ({e}); use --dir", file=sys.stderr)
        return None


def _find(store: DumpStore, args: argparse.Namespace) -> IncidentInfo | None:
    try:
        return store.find(args.incident, run=args.run)
    except KeyError as exc:
        print(f"rankwatch dumps: {exc.args[0]}", file=sys.stderr)
        return None


def _incident_json(info: IncidentInfo) -> dict[str, Any]:
    return {
        "run": info.run,
        "incident": info.name,
        "reason": info.reason,
        "time": info.time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ranks": info.ranks,
        "path": str(info.path),
    }


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    if not store.root.is_dir():
        print(f"rankwatch dumps: {store.root}: no such directory (set --dir or dumps.dir)", file=sys.stderr)
        return 2
    incidents = store.list_incidents()
    if args.run:
        incidents = [i for i in incidents if i.run == args.run]
    if args.json:
        print(
            json.dumps(
                {"root": str(store.root), "incidents": [_incident_json(i) for i in incidents]}, indent=2
            )
        )
        return 0 if incidents else 1
    if not incidents:
        print(f"no incidents under {store.root}", file=sys.stderr)
        return 1
    print(f"{'TIME (UTC)':<20} {'RUN':<20} {'REASON':<16} {'RANKS':<12} INCIDENT")
    for info in incidents:
        when = info.time.strftime("%Y-%m-%d %H:%M:%S")
        ranks = ranksets.format_ranks(info.ranks, limit=4) or "-"
        print(
            f"{when:<20} {visible(info.run):<20} {visible(info.reason):<16} {ranks:<12} {visible(info.name)}"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = _store(args)
    info = _find(store, args)
    if info is None:
        return 1
    if args.rank is not None and args.rank not in info.ranks:
        print(
            f"rankwatch dumps: incident {info.name} has no rank {args.rank} "
            f"(has {ranksets.describe_ranks(info.ranks)})",
            file=sys.stderr,
        )
        return 1
    ranks = [args.rank] if args.rank is not None else info.ranks
    if not ranks:
        print(f"rankwatch dumps: incident {info.name} holds no rank dumps", file=sys.stderr)
        return 1
    if args.json:
        # Each rank's dump as stored (py-spy's JSON stacks, or the error that kept them away).
        doc = {**_incident_json(info), "dumps": {str(r): store.load_rank(info, r) for r in ranks}}
        print(json.dumps(doc, indent=2, default=str))
        return 0
    print(visible(f"incident {info.run}/{info.name}  ({info.path})"))
    for rank in ranks:
        print()
        print(format_rank(store.load_rank(info, rank), fold_idle=not args.all_threads), end="")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    store = _store(args)
    info = _find(store, args)
    if info is None:
        return 1
    if not info.ranks:
        print(f"rankwatch dumps: incident {info.name} holds no rank dumps", file=sys.stderr)
        return 1
    # The live agents recorded the world size (ranks that never wrote a stack are suspects too)
    # and a rank that failed first (one that left the job has no stack to show).
    recorded = store.load_diagnosis(info)
    world = recorded.world_size if recorded is not None else None
    result = diff_incident({r: store.load_rank(info, r) for r in info.ranks}, world_size=world)
    first = recorded.first_failure if recorded is not None else None
    if first is not None and first.rank is not None:
        result.suspects = [first.rank]
        result.reason = f"rank {first.rank} failed first: {first.how or first.kind}"
        result.verdict = "first_failure"
    from rankwatch.dumps import flight  # here: the agent builds this parser at every start

    traces = flight.load_folder(info.path)  # PyTorch's flight recorder, where it was collected
    fr = flight.analyze(traces) if traces else None
    if args.json:
        doc = {"incident": info.name, "run": info.run, **result.to_dict()}
        doc["diagnosis"] = result.diagnosis(str(info.path)).but(first_failure=first).to_json()
        if traces:
            doc["flight_recorder"] = {"ranks": sorted(traces), "verdict": fr.to_dict() if fr else None}
        print(json.dumps(doc, indent=2))
    else:
        print(visible(f"incident {info.run}/{info.name}"))
        # The frames and thread names a diff quotes are the job's text: shown, never obeyed.
        print(visible_lines(format_diff(result)), end="")
        print(visible_lines(flight.format_verdict(fr, sorted(traces))), end="")
    return 0


def cmd_capture(args: argparse.Namespace) -> int:
    pids: list[int] = args.pid
    ranks: list[int] = args.rank or list(range(len(pids)))
    if len(ranks) != len(pids):
        print("rankwatch dumps capture: give one --rank per --pid (or none)", file=sys.stderr)
        return 2
    store = _store(args)
    if args.run is None:  # the agents' own run name: the Slurm job id or torchrun's run id
        from rankwatch.config.schema import RunConfig
        from rankwatch.identity import identity_from_env

        cfg = _config(args)
        args.run = identity_from_env(cfg.run if cfg is not None else RunConfig()).run
    incident = incident_name(args.reason, datetime.now(timezone.utc))
    try:  # before any capture: an unwritable folder is one line, not a traceback after py-spy ran
        folder = store.incident_dir(args.run, incident)
    except OSError as e:
        where = e.filename or store.root
        why = e.strerror or e
        print(f"rankwatch: error: {where}: cannot make the incident folder: {why}", file=sys.stderr)
        return 2
    failures = 0
    for pid, rank in zip(pids, ranks, strict=True):
        result = capture(
            pid,
            native=args.native,
            locals_=args.locals,
            nonblocking=args.nonblocking,
            timeout=args.timeout,
        )
        try:
            meta = {"source": "manual", "reason": args.reason}
            path = store.write_rank(args.run, incident, rank, result, meta)
        except OSError as e:
            print(f"rankwatch: error: {e.filename or folder}: {e.strerror or e}", file=sys.stderr)
            return 2
        if result.ok:
            print(f"rank {rank} (pid {pid}): {path}")
        else:
            failures += 1
            print(f"rank {rank} (pid {pid}): {result.error}\n{result.text}", file=sys.stderr)
    print(f"incident: {folder}")
    return 1 if failures else 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        help="dumps folder (default: $RANKWATCH_DUMPS_DIR, else the config's dumps.dir, "
        "else ./rankwatch-dumps)",
    )
    parser.add_argument("--config", help="agent config whose dumps.dir to read (default: $RANKWATCH_CONFIG)")


def add_subcommands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``dumps`` and its own subcommands on the main CLI's subparsers."""
    dumps = sub.add_parser("dumps", help="list, show, diff and capture py-spy stack dumps")
    dsub = dumps.add_subparsers(dest="dumps_command", metavar="{list,show,diff,capture}")
    dsub.required = True

    p = dsub.add_parser("list", help="list incidents, newest first")
    _common(p)
    p.add_argument("--run", help="only this run")
    p.add_argument("--json", action="store_true", help="one JSON document: the incidents, newest first")
    p.set_defaults(func=cmd_list)

    p = dsub.add_parser("show", help="show the stacks of an incident")
    p.add_argument("incident", help="incident name, unique prefix, run/name or folder path")
    p.add_argument("--rank", type=int, help="only this rank's stacks (default: every rank of the incident)")
    p.add_argument("--run", help="the run the incident belongs to, when its name alone is ambiguous")
    p.add_argument("--all-threads", action="store_true", help="do not fold idle threads")
    p.add_argument("--json", action="store_true", help="one JSON document: each rank's dump as stored")
    _common(p)
    p.set_defaults(func=cmd_show)

    p = dsub.add_parser("diff", help="group ranks by stack and name the rank that differs")
    p.add_argument("incident", help="incident name, unique prefix, run/name or folder path")
    p.add_argument("--run", help="the run the incident belongs to, when its name alone is ambiguous")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON document: groups of ranks, suspects, verdict, flight recorder",
    )
    _common(p)
    p.set_defaults(func=cmd_diff)

    p = dsub.add_parser("capture", help="dump processes now into a new incident")
    p.add_argument(
        "--pid", type=int, action="append", required=True, help="a process to dump (repeat for several)"
    )
    p.add_argument("--rank", type=int, action="append", help="rank of each --pid, in order")
    p.add_argument(
        "--run",
        default=os.environ.get("RANKWATCH_RUN") or None,
        help="run name (default: $RANKWATCH_RUN, else the Slurm job id or torchrun run id, as the agents)",
    )
    p.add_argument(
        "--reason", default="manual", help="the word in the incident folder's name (default: manual)"
    )
    p.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    p.add_argument("--locals", action="store_true", help="include local variables")
    p.add_argument("--nonblocking", action="store_true", help="do not pause the target")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds py-spy may take per process (default: 10)"
    )
    _common(p)
    p.set_defaults(func=cmd_capture)
