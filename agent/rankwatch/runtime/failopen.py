"""Fail-open mode of a sidecar agent that cannot start (``rankwatch watch --fail-open``).

A native sidecar (an init container with ``restartPolicy: Always``) that exits before it
counts as started holds the pod's main containers back: a config typo would keep the
trainer from ever starting. With ``--fail-open`` an agent that cannot start stays up
instead, watches nothing, and says so where an operator looks: an error in its log
(repeated every hour), ``rankwatch_agent_degraded{reason} 1`` on ``/metrics`` (the bundled
rule ``RankwatchAgentDegraded`` alerts on it) and ``/readyz`` answering 503 with the
reason. ``/healthz`` answers 200, so a liveness probe does not restart it into the same
error. SIGTERM or SIGINT ends it with status 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

from rankwatch import __version__

log = logging.getLogger("rankwatch.failopen")

DEFAULT_LISTEN = "0.0.0.0:9478"
REMIND_EVERY = 3600.0


def listen_from(config_path: str | None, flag: str | None) -> str:
    """Where to serve: ``--listen``, else ``server.listen`` read loosely from the broken
    file (the error may be elsewhere in it), else the default."""
    from rankwatch.slurm import resolve_listen

    return resolve_listen(_listen_from(config_path, flag))


def _listen_from(config_path: str | None, flag: str | None) -> str:
    if flag:
        return flag
    if config_path:
        try:
            import yaml

            with open(config_path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
            listen = doc.get("server", {}).get("listen") if isinstance(doc, dict) else None
            if isinstance(listen, str) and listen and "${" not in listen:
                return listen
        except Exception:  # best effort: the file is known to be broken
            pass
    return DEFAULT_LISTEN


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(reason: str, labels: dict[str, str]) -> str:
    extra = "".join(f',{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if v)
    return (
        "# HELP rankwatch_agent_degraded 1 while the agent runs without watching anything because it "
        "could not start (reason: config_error, usage_error, internal_error).\n"
        "# TYPE rankwatch_agent_degraded gauge\n"
        f'rankwatch_agent_degraded{{reason="{_escape(reason)}"{extra}}} 1\n'
        "# HELP rankwatch_build_info rankwatch version.\n"
        "# TYPE rankwatch_build_info gauge\n"
        f'rankwatch_build_info{{version="{__version__}"{extra}}} 1\n'
    )


def _identity_labels() -> dict[str, str]:
    try:
        from rankwatch.config.schema import RunConfig
        from rankwatch.identity import identity_from_env

        return identity_from_env(RunConfig()).labels()
    except Exception:  # the labels are a courtesy, the gauge is what matters
        return {}


async def serve_degraded(reason: str, message: str, listen: str, *, stop: asyncio.Event | None = None) -> int:
    """Serve health, readiness and the degraded gauge until stopped; 0."""
    from aiohttp import web

    from rankwatch.server import parse_listen

    stop = stop or asyncio.Event()
    text = metrics_text(reason, _identity_labels())
    detail = f"rankwatch is not watching: {message}\n"

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok (degraded: not watching)\n")

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(status=503, text=detail)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def index(_: web.Request) -> web.Response:
        return web.Response(status=503, text=detail)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/", index)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        host, port = parse_listen(listen)
        sock = socket.create_server((host, port), reuse_port=False)
        bound = sock.getsockname()
        await web.SockSite(runner, sock).start()
        log.error("fail-open: serving /healthz, /readyz (503) and /metrics on %s:%d", bound[0], bound[1])
    except (OSError, ValueError) as e:
        log.error("fail-open: cannot serve on %s (%s); staying up without a server", listen, e)

    loop = asyncio.get_running_loop()
    from rankwatch.runtime.signals import on_signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        on_signal(loop, sig, stop.set)
    try:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), REMIND_EVERY)
            except asyncio.TimeoutError:
                log.error("still not watching anything: %s", message)
    finally:
        await runner.cleanup()
    return 0


def run_degraded(reason: str, message: str, listen: str) -> int:
    log.error(
        "rankwatch could not start (%s): %s. --fail-open: the training is NOT watched; the agent stays "
        "up so that it holds nothing back; fix the cause and restart the pod (or the agent)",
        reason,
        message,
    )
    return asyncio.run(serve_degraded(reason, message, listen))
