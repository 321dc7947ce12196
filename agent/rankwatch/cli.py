"""The ``rankwatch`` command: argument parsing and wiring, nothing else.

Subcommand modules are imported only when used so ``rankwatch --help`` stays instant.
Exit codes: 0 fine, 1 findings (analyze) or failure, 2 bad usage, bad config or bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rankwatch import __version__

if TYPE_CHECKING:
    from rankwatch.config.schema import Config
    from rankwatch.identity import Identity
    from rankwatch.runtime.services import Services

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


def _load_config(args: argparse.Namespace) -> Config:
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


def _is_log_name(f: Path) -> bool:
    """``rank-0.log``, and compressed: ``rank-0.log.gz``, ``slurm-12.out.xz``."""
    from rankwatch.sources.compressed import SUFFIXES

    if f.suffix in SUFFIXES:
        f = f.with_suffix("")
    return f.suffix in LOG_SUFFIXES


def _expand_paths(paths: Sequence[str]) -> list[str]:
    from rankwatch.sources.compressed import UnreadableCompression, compression_of, require_readable

    out: list[str] = []
    if paths.count("-") > 1:
        raise UsageError("-: standard input can be read once")
    for p in paths:
        if p == "-":
            out.append(p)
            continue
        path = Path(p)
        try:
            is_dir = path.is_dir()
            files = sorted(f for f in path.iterdir() if f.is_file() and _is_log_name(f)) if is_dir else []
        except OSError as e:
            raise UsageError(f"{p}: {e.strerror or e}") from None
        if is_dir:
            if not files:
                raise UsageError(
                    f"{p}: directory holds no log files ({', '.join(LOG_SUFFIXES)}, or one of them "
                    "compressed: .gz, .bz2, .xz)"
                )
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
    for f in out:
        if f == "-":
            continue
        kind = compression_of(f)
        if kind is not None:
            try:
                require_readable(kind, f)
            except UnreadableCompression as e:
                raise UsageError(str(e)) from None
    return out


def cmd_analyze(args: argparse.Namespace) -> int:
    from rankwatch.analyze import analyze, diagnose, format_human

    cfg = _load_config(args)
    paths = _expand_paths(args.paths)
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be 1 or more, got {args.jobs}")
    if args.suggest_pattern:
        found = [(p, d.pattern) for p, d in diagnose(paths, cfg) if d.pattern]
        for p, pattern in found:
            print(f"# {p}\n{pattern}" if len(paths) > 1 else pattern)
        if not found:
            raise UsageError("no line of these logs looks like a record a pattern could be drafted from")
        return 0
    from rankwatch.sources.compressed import UnreadableCompression

    try:  # a file's compression is checked above; standard input's only when it is read
        if sys.stderr.isatty() and not args.quiet and not args.no_progress:
            from rankwatch.progress import DELAY, Progress

            delay = float(os.environ.get("RANKWATCH_PROGRESS_DELAY", DELAY))
            with Progress(paths, sys.stderr, delay=delay):
                result = analyze(paths, cfg, jobs=args.jobs)
        else:
            result = analyze(paths, cfg, jobs=args.jobs)
    except UnreadableCompression as e:
        raise UsageError(str(e)) from None
    if not result.recognised_any:
        # A wrong path or an unknown format must not read as a healthy run.
        names = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        why = "\n".join(f"{p}: {d.render()}" for p, d in diagnose(paths[:5], cfg))
        raise UsageError(
            f"no training records or error lines recognised in {names}: not a training log, or a "
            "format rankwatch does not detect (force one with --format, or set logs.regex; "
            f"`rankwatch analyze --suggest-pattern` prints a drafted one)\n{why}"
        )
    if args.json:
        json.dump(
            result.to_json(), sys.stdout, indent=2 if args.pretty else None, allow_nan=False, default=str
        )
        sys.stdout.write("\n")
    else:
        colour = sys.stdout.isatty() and not args.no_color and not os.environ.get("NO_COLOR")
        print(format_human(result, colour=colour))
    return result.exit_code()


def cmd_config_show(args: argparse.Namespace) -> int:
    from rankwatch.config.render import render_config

    if getattr(args, "json", False):
        import dataclasses

        from rankwatch.config.render import redacted

        json.dump(dataclasses.asdict(redacted(_load_config(args))), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    sys.stdout.write(render_config(_load_config(args)))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    from rankwatch.config.loader import load_config

    cfg = load_config(args.file)
    if cfg.server.enabled:
        _check_server_start(cfg, args.file)
    print(f"{args.file}: ok")
    return 0


def _check_server_start(cfg: Config, file: str) -> None:
    """What the server refuses at start and the schema cannot see: the address, and the web
    config file read as at start (its keys, certificates, and basic auth against
    ``server.metrics_token``)."""
    from rankwatch.config.loader import ConfigError
    from rankwatch.server import parse_listen
    from rankwatch.server.app import load_server_web_config
    from rankwatch.slurm import resolve_listen

    try:
        parse_listen(resolve_listen(cfg.server.listen))
    except ValueError as e:
        raise ConfigError(str(e), file=file, key="server.listen") from None
    if not cfg.server.web_config:
        return  # the web config's module (TLS, bcrypt) is loaded only by an agent that has one
    from rankwatch.server.webconfig import WebConfigError

    try:
        load_server_web_config(cfg.server)
    except WebConfigError as e:
        raise ConfigError(str(e), file=file, key="server.web_config") from None


def _live_config(args: argparse.Namespace) -> Config:
    """The file, then --set, then the live flags: also what a config hot reload rebuilds."""
    cfg = _load_config(args)
    flags = {
        "dumps.dir": getattr(args, "dumps_dir", None),
        "checkpoints.dir": getattr(args, "checkpoint_dir", None),
        "server.listen": getattr(args, "listen", None),
        "server.web_config": getattr(args, "web_config", None),
    }
    overrides = {k: v for k, v in flags.items() if v}
    if getattr(args, "no_server", False):
        overrides["server.enabled"] = False
    if overrides:
        from rankwatch.config.loader import with_overrides

        cfg = with_overrides(cfg, overrides)
    from rankwatch.slurm import resolve_listen

    listen = resolve_listen(cfg.server.listen)
    if listen != cfg.server.listen:
        from rankwatch.config.loader import with_overrides

        cfg = with_overrides(cfg, {"server.listen": listen})
    return cfg


def _own_user() -> str | None:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name[:64]
    except (KeyError, OSError):
        return None


def _live_setup(args: argparse.Namespace, cmd: list[str] | None = None) -> tuple[Config, Identity, list[Any]]:
    from rankwatch.actions.console import ConsoleSink, JsonlSink
    from rankwatch.identity import identity_from_env, launcher_run_id

    cfg = _live_config(args)
    from rankwatch.config.redact import config_secrets, install_log_redaction

    install_log_redaction(config_secrets(cfg))  # no token, password or hook URL in the agent's log
    if cfg.server.enabled:
        from rankwatch.server import parse_listen

        try:
            parse_listen(cfg.server.listen)
        except ValueError as e:
            raise UsageError(f"server.listen: {e}") from e
    identity = identity_from_env(cfg.run)
    if cmd and cfg.run.name is None and identity.run == "default":
        # `run -- torchrun --rdzv-id J`: the workers' run, from the start (a job's nodes' agents
        # share its alert board and run folder; the run name the user chose still wins).
        rid = launcher_run_id(cmd)
        if rid is not None:
            identity = dataclasses.replace(identity, run=rid)
    if cmd and identity.user is None:
        # What `run` starts runs as the agent's own user: its findings and alerts say whose.
        identity = dataclasses.replace(identity, user=_own_user())
    sinks: list[Any] = [ConsoleSink(identity)]
    if args.findings_jsonl:
        sinks.append(JsonlSink(args.findings_jsonl, identity))
    return cfg, identity, sinks


def _live_services(args: argparse.Namespace) -> dict[str, Any]:
    from rankwatch.runtime.reload import ConfigSource, config_path_from

    path = config_path_from(getattr(args, "config", None))
    services: dict[str, Any] = {}
    if path is not None:
        services["config_source"] = ConfigSource(path, lambda: _live_config(args))
    sd_file = getattr(args, "sd_file", None)

    def on_start(s: Services) -> None:
        if sd_file:
            _write_sd_file(sd_file, s)
        release_startup_memory()

    services["on_start"] = on_start
    return services


def release_startup_memory() -> None:
    """Hand back to the system what starting up left free: the config's YAML, the parsers'
    and argparse's scratch objects are garbage once the agent runs, but the C allocator keeps
    the freed pages in the process (a few MB of its RSS for the agent's lifetime) until
    ``malloc_trim`` returns them. glibc only; elsewhere only the cycle collection."""
    import gc

    gc.collect()
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols: glibc's, if linked
    except (OSError, AttributeError):  # musl has none: nothing to trim
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def _write_sd_file(path: str, services: Services) -> None:
    """--sd-file: the address the server really bound, for Prometheus file_sd."""
    from rankwatch.slurm import sd_labels, target_host, write_sd_file

    server = services.server
    if server is None:
        logging.getLogger("rankwatch").warning("--sd-file %s not written: no HTTP server is running", path)
        return
    target = f"{target_host(server.host, services.agent.identity.node)}:{server.port}"
    try:
        write_sd_file(path, target, sd_labels())
    except OSError as e:
        logging.getLogger("rankwatch").warning("--sd-file %s not written: %s", path, e)
        return
    logging.getLogger("rankwatch").info("Prometheus target %s written to %s", target, path)


def _live(args: argparse.Namespace, main: Coroutine[Any, Any, int]) -> int:
    """Run a live agent's coroutine; its --sd-file goes away with it."""
    import asyncio

    try:
        return asyncio.run(main)
    finally:
        if getattr(args, "sd_file", None):
            from rankwatch.slurm import remove_sd_file

            remove_sd_file(args.sd_file)


def cmd_run(args: argparse.Namespace) -> int:

    from rankwatch.runtime.modes import run_command

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("run: no command given (rankwatch run [options] -- CMD ARGS...)")
    cfg, identity, sinks = _live_setup(args, cmd)
    nice = cfg.process.agent_nice
    return _live(args, run_command(cfg, identity, cmd, sinks=sinks, services=_live_services(args), nice=nice))


def cmd_watch(args: argparse.Namespace) -> int:
    if args.fail_open:
        return _watch_failing_open(args)
    _check_watch_args(args)
    cfg, identity, sinks = _live_setup(args)
    _check_watch_args(args, _k8s(args, cfg))
    return _live(args, _watch_coro(args, cfg, identity, sinks))


def _k8s(args: argparse.Namespace, cfg: Any) -> bool:
    return bool(getattr(args, "k8s", False) or cfg.kubernetes.enabled)


def _watch_coro(args: argparse.Namespace, cfg: Any, identity: Any, sinks: Any) -> Any:
    """The node daemon on Kubernetes (``--k8s`` / ``kubernetes.enabled``) or the sidecar."""
    if _k8s(args, cfg):
        from rankwatch.runtime.podwatch import watch_pods

        return watch_pods(cfg, identity, sinks=sinks, services=_live_services(args))
    from rankwatch.runtime.modes import watch_processes

    return watch_processes(
        cfg,
        identity,
        pids=args.pid or [],
        match=args.match,
        logs=[Path(p) for p in args.log or []],
        sinks=sinks,
        services=_live_services(args),
        nice=cfg.process.agent_nice,
    )


def _check_watch_args(args: argparse.Namespace, k8s: bool = True) -> None:
    """``k8s`` true until the config is read: the node daemon needs neither --pid nor --log."""
    import re

    if args.match:
        try:
            re.compile(args.match)
        except re.error as e:
            raise UsageError(f"--match {args.match!r}: bad regex: {e}") from e
    if not (args.pid or args.match or args.log or k8s):
        raise UsageError("watch: give --pid PID, --match REGEX and/or --log PATH, or --k8s")


def _watch_failing_open(args: argparse.Namespace) -> int:
    """``watch --fail-open``: a config, usage or internal error leaves the agent up in a
    degraded mode (runtime/failopen.py) instead of exiting, so a sidecar never holds back
    or takes down the trainer it watches."""

    from rankwatch.config.loader import ConfigError
    from rankwatch.runtime.failopen import listen_from, run_degraded

    config_path = getattr(args, "config", None) or os.environ.get("RANKWATCH_CONFIG") or None
    listen = listen_from(config_path, args.listen)
    try:
        _check_watch_args(args)
        cfg, identity, sinks = _live_setup(args)
        _check_watch_args(args, _k8s(args, cfg))
    except ConfigError as e:
        return run_degraded("config_error", f"config error: {e}", listen)
    except UsageError as e:
        return run_degraded("usage_error", str(e), listen)
    try:
        rc = _live(args, _watch_coro(args, cfg, identity, sinks))
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # fail open: any crash leaves the trainer alone
        logging.getLogger("rankwatch").exception("the agent failed")
        return run_degraded("internal_error", f"{type(e).__name__}: {e}", listen)
    if rc == 2:
        return run_degraded("usage_error", "watch exited with status 2 (see the lines above)", listen)
    return rc


def cmd_completion(args: argparse.Namespace) -> int:
    from rankwatch.completion import bash_script, zsh_script

    parser = build_parser()
    sys.stdout.write(bash_script(parser) if args.shell == "bash" else zsh_script(parser))
    return 0


def agent_token(cfg: Config | None) -> str | None:
    """The token to talk to an agent with: ``server.token`` from the config, else the one the
    agents of this user on this node made in the runtime folder (``server.tokenfile``)."""
    if cfg is not None and cfg.server.token:
        return cfg.server.token
    from rankwatch.server.tokenfile import UnsafeTokenFile, read_token

    try:
        return read_token()
    except UnsafeTokenFile as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"{e.filename or 'the token file'}: {e.strerror or e}") from None


def local_url(listen: str, web_config: str | None = None) -> str:
    """The local agent's address; https when its web config has ``tls_server_config``."""
    from rankwatch.server import parse_listen

    try:
        host, port = parse_listen(listen)
    except ValueError as e:
        raise UsageError(f"server.listen: {e}") from None
    scheme = "http"
    if web_config:
        from rankwatch.server.webconfig import WebConfigError, load_web_config

        try:
            scheme = "https" if load_web_config(web_config).ssl is not None else "http"
        except WebConfigError as e:
            raise UsageError(str(e)) from None
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def cmd_url(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    cfg = _load_config(args)
    base = (args.url or local_url(cfg.server.listen, cfg.server.web_config)).rstrip("/")
    token = agent_token(cfg)
    if not token:
        from rankwatch.server.tokenfile import token_path

        raise UsageError(
            f"no token: server.token is unset and no agent of this user has made {token_path()} yet"
        )
    print(f"{base}/?token={quote(token, safe='')}")
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from rankwatch.top import run_top

    if args.interval <= 0:
        raise UsageError(f"--interval must be above 0, got {args.interval}")
    cfg = _load_config(args)
    agents = [u if "://" in u else f"http://{u}" for u in args.urls]
    if args.prometheus and agents:
        raise UsageError("top: give agent URLs or --prometheus, not both")
    tokens: dict[str, str | None] = {}
    if not args.prometheus:
        from urllib.parse import urlsplit

        from rankwatch.server.auth import is_loopback_host

        agents = agents or [local_url(cfg.server.listen, cfg.server.web_config)]
        given = args.token or (cfg.server.token or None)
        # The token file's token is this node's: it goes to agents on this node only, never
        # to a URL on another host (which would learn it).
        mine = None if given else agent_token(None)
        for u in agents:
            tokens[u] = given or (mine if is_loopback_host(urlsplit(u).hostname or "") else None)
    from rankwatch.top import tls_context

    try:
        tls = tls_context(args.cacert, args.cert, args.key)
    except (OSError, ValueError) as e:
        raise UsageError(f"--cacert/--cert/--key: {e}") from None
    return run_top(
        agents,
        tokens,
        prometheus=args.prometheus,
        run=args.run,
        interval=args.interval,
        once=args.once,
        tls=tls,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from rankwatch.demo.scenario import run_demo

    return run_demo(workdir=args.workdir, ranks=args.ranks, keep=args.keep)


# Subcommands whose parsers live in their own packages: building them imports those packages.
PACKAGE_COMMANDS = ("dumps", "report", "checkpoints")


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top-level
    options, -v -q --version, take no value)."""
    for a in argv:
        if a == "--":
            return None
        if not a.startswith("-"):
            return a
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``command`` one of the subcommands defined here, without the
    ``dumps``, ``report`` and ``checkpoints`` parsers, whose modules a live agent (``run``,
    ``watch``) would otherwise import at every start and keep for its lifetime."""
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
        help="parsers and detectors over finished logs, one file per rank",
        description="Analyze finished logs. Rank comes from the file name (rank-3.log) or from launcher "
        "prefixes on each line; gzip, bzip2 and xz files are read as the text they hold. Exit 0: nothing "
        "of severity warning or above; 1: such findings; 2: bad input.",
    )
    a.add_argument(
        "paths", nargs="+", metavar="PATH", help="log files, or directories of them; - reads standard input"
    )
    a.add_argument(
        "--json",
        action="store_true",
        help='print one JSON document: {"ranks": [...], "findings": [...]}, each finding with kind, '
        "severity, rank, path, step, line and message (README: Analyze finished logs)",
    )
    a.add_argument("--pretty", action="store_true", help="indent the JSON")
    a.add_argument("--format", help="force a log format instead of auto-detection")
    a.add_argument(
        "--suggest-pattern",
        action="store_true",
        help="print a drafted logs.regex for the lines that look like records (for a log rankwatch "
        "does not read), instead of analyzing",
    )
    a.add_argument("--no-color", action="store_true", help="no ANSI colour in the summary")
    a.add_argument(
        "--quiet",
        dest="no_progress",
        action="store_true",
        help="no progress line (shown on stderr only when it is a terminal; also off with -q)",
    )
    a.add_argument(
        "-j",
        "--jobs",
        type=int,
        metavar="N",
        help="analyze up to N files at once in worker processes (default: one per core when the "
        "files add up to 64 MiB or more, and a file of 64 MiB or more read in here is read by a second "
        "process while this one parses; 1: all in this process)",
    )
    a.set_defaults(func=cmd_analyze)

    live = argparse.ArgumentParser(add_help=False, parents=[common])
    live.add_argument(
        "--findings-jsonl", metavar="FILE", help="also append every finding to FILE as JSON lines"
    )
    live.add_argument("--dumps-dir", metavar="DIR", help="root of stack-dump incidents (config dumps.dir)")
    live.add_argument(
        "--checkpoint-dir", metavar="DIR", help="watch this checkpoint directory (config checkpoints.dir)"
    )
    live.add_argument(
        "--web.config.file",
        dest="web_config",
        metavar="FILE",
        help="exporter-toolkit web config (TLS, client certificates, bcrypt basic auth on /metrics), as "
        "node_exporter takes it (config server.web_config)",
    )
    live.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="serve /metrics and the API here (config server.listen; default :9478). PORT 'auto': the "
        "Slurm step's reserved port (SLURM_STEP_RESV_PORTS, by SLURM_LOCALID) if any, else any free "
        "port; with --sd-file Prometheus learns the real one",
    )
    live.add_argument(
        "--sd-file",
        metavar="FILE",
        help="write a Prometheus file_sd entry with the address the server really bound (node:port, "
        "Slurm job labels) once it listens; removed when the agent exits",
    )
    live.add_argument("--no-server", action="store_true", help="no HTTP server (config server.enabled)")

    r = sub.add_parser(
        "run",
        parents=[live],
        help="launch CMD as the watched rank, following its output file",
        description="Launch CMD as the watched rank. Its output goes to a log file (runner.log_dir) that "
        "the agent follows and echoes; SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR2 are forwarded "
        "(SIGINT/SIGHUP/SIGQUIT to CMD's process group, as a terminal sends them); SIGUSR1 captures "
        "stack dumps. The exit status is the child's (128+N for signal N).",
    )
    r.add_argument(
        "cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the rank's command line, after --"
    )
    r.set_defaults(func=cmd_run)

    w = sub.add_parser(
        "watch",
        parents=[live],
        help="attach to running ranks and logs (sidecar, srun --overlap)",
        description="Attach to rank processes that are already running (by --pid, or every process "
        "whose command line matches --match) and follow their logs: the Kubernetes sidecar, a node "
        "daemon, or `srun --overlap` next to a job step. Nothing in the watched processes changes; "
        "stopping the agent (SIGTERM, SIGINT or a terminal's SIGHUP: status 0) never affects them.",
    )
    w.add_argument(
        "--fail-open",
        action="store_true",
        help="when the agent cannot start (bad config, bad flags, a crash), stay up watching nothing: "
        "log the error, export rankwatch_agent_degraded 1, answer /readyz with 503; for sidecars, "
        "which must never block or kill the trainer",
    )
    w.add_argument("--pid", type=int, action="append", help="process to watch (repeatable)")
    w.add_argument(
        "--match", metavar="REGEX", help="watch processes whose command line matches (found again on restart)"
    )
    w.add_argument(
        "--log",
        action="append",
        metavar="PATH",
        help="log file to follow (repeatable; rank from its name as in analyze, one file too; "
        "run.rank wins over the name, the name over RANK)",
    )
    w.add_argument(
        "--k8s",
        action="store_true",
        help="node DaemonSet on Kubernetes: every opted-in pod's ranks on this node, found by cgroup, "
        "logs from /var/log/pods, GPUs from the kubelet's pod-resources API (config: kubernetes.*)",
    )
    w.set_defaults(func=cmd_watch)

    d = sub.add_parser(
        "demo",
        help="4 simulated ranks with injected faults, an agent each (~20 s)",
    )
    d.add_argument("--ranks", type=int, default=4, help="number of simulated ranks (2..8)")
    d.add_argument("--workdir", help="where logs and dumps go (default: a temporary folder)")
    d.add_argument("--keep", action="store_true", help="keep the temporary folder")
    d.set_defaults(func=cmd_demo)

    u = sub.add_parser(
        "url",
        parents=[common],
        help="print the status page link with the token (the agent's own, from the runtime folder)",
        description="Print the link that opens an agent's status page in a browser: the token is "
        "server.token, or the one the agents of this user on this node keep in "
        "$XDG_RUNTIME_DIR/rankwatch/token (else <tmp>/rankwatch-<uid>/token).",
    )
    u.add_argument("url", nargs="?", help="the agent's address (default: from server.listen, on loopback)")
    u.set_defaults(func=cmd_url)

    t = sub.add_parser(
        "top",
        parents=[common],
        help="live view of a run's ranks in the terminal, the rank in trouble first",
        description="A live view of a run's ranks: step, steps/s, loss, GPU utilisation and memory, "
        "time since progress and active findings, the rank in trouble first. From agents' URLs (their "
        "/api/status with the token, and /metrics) or from Prometheus (--prometheus). NO_COLOR turns "
        "colour off; COLUMNS sets the width.",
    )
    t.add_argument(
        "urls", nargs="*", metavar="URL", help="agents (default: the local one, from server.listen)"
    )
    t.add_argument("--prometheus", metavar="URL", help="read the rankwatch_* series from this Prometheus")
    t.add_argument("--run", help="only this run")
    t.add_argument(
        "--token",
        help="the agents' token (default: server.token / $RANKWATCH_TOKEN, else this user's token file)",
    )
    t.add_argument("--interval", type=float, default=2.0, help="seconds between frames (default 2)")
    t.add_argument("--once", action="store_true", help="print one frame and exit (scripts)")
    t.add_argument(
        "--cacert", metavar="FILE", help="CA that signed the agents' TLS certificates (web config)"
    )
    t.add_argument("--cert", metavar="FILE", help="client certificate, for agents that require one")
    t.add_argument("--key", metavar="FILE", help="the client certificate's key (default: in --cert)")
    t.set_defaults(func=cmd_top)

    c = sub.add_parser("config", help="show the effective configuration or check a file")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    cs = csub.add_parser("show", parents=[common], help="print the effective config with defaults and docs")
    cs.add_argument(
        "--json", action="store_true", help="print the effective config as one JSON object (secrets redacted)"
    )
    cs.set_defaults(func=cmd_config_show)
    cc = csub.add_parser("check", help="validate a config file (exit 2 with file:line: key on error)")
    cc.add_argument("file", help="the YAML config file to validate")
    cc.set_defaults(func=cmd_config_check)

    if command is None or command in PACKAGE_COMMANDS or command not in sub.choices:
        from rankwatch.checkpoints.cli import add_subcommands as add_checkpoints
        from rankwatch.dumps.cli import add_subcommands as add_dumps
        from rankwatch.report.cli import add_subcommands as add_report

        add_dumps(sub)
        add_report(sub)
        add_checkpoints(sub)

    comp = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description='Print a completion script for the shell: eval "$(rankwatch completion bash)" in '
        "~/.bashrc, or save it as /etc/bash_completion.d/rankwatch; zsh: eval "
        '"$(rankwatch completion zsh)" in ~/.zshrc.',
    )
    comp.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete for")
    comp.set_defaults(func=cmd_completion)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_of(argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        if e.code == 2 and "watch" in argv and "--fail-open" in argv:
            # A typo in a sidecar's extra arguments must not crash-loop it in front of the trainer.
            from rankwatch.runtime.failopen import listen_from, run_degraded

            _setup_logging(0, False)
            return run_degraded("usage_error", f"bad arguments: {' '.join(argv)}", listen_from(None, None))
        raise
    _setup_logging(args.verbose, args.quiet)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    del parser  # not kept for a live agent's lifetime (argparse's objects hold cycles: gc frees them)
    from rankwatch.config.loader import ConfigError

    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"rankwatch: config error: {e}", file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"rankwatch: error: {e}", file=sys.stderr)
        return 2
    except (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
        # A path the user named or configured: one line naming it, never a traceback.
        where = f"{e.filename}: " if e.filename else ""
        print(f"rankwatch: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
