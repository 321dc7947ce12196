"""The agent's HTTP server: /metrics, health probes, a read-only JSON API, a status page.

It runs on the agent's event loop and reads only snapshots of the agent
(``rankwatch.snapshot``), taken by a callable the runtime hands it; it writes only its own
counters (``HttpCounters``), so it needs no locks. This module wires the parts: who may read
what (``auth``), the routes (``routes``), the connection limits and guard (``protocol``), and
the listener with the optional web config's TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from rankwatch.config.schema import ServerConfig
from rankwatch.exporter.metrics import make_registry
from rankwatch.server.auth import authenticate, exposure_warning, with_token
from rankwatch.server.keys import CFG, COUNTERS, LOGGED, REGISTRY, SNAPSHOT, WEB
from rankwatch.server.protocol import (
    GUARD,
    MAX_HEADER_FIELD,
    MAX_HEADERS,
    MAX_REQUEST_LINE,
    AcceptErrors,
    ConnectionGuard,
    Protocol,
    connection_cap,
    limit_body,
    rejecter,
    track,
)
from rankwatch.server.routes import add_routes, errors

if TYPE_CHECKING:
    from rankwatch.server.webconfig import WebConfig
from rankwatch.snapshot import Source, snapshot_fn

log = logging.getLogger("rankwatch.server")


def make_app(
    source: Source,
    cfg: ServerConfig | None = None,
    *,
    registry: CollectorRegistry | None = None,
    web_config: WebConfig | None = None,
) -> web.Application:
    """The application without a listener (tests use aiohttp's test client on it).
    ``source``: the agent (anything with ``snapshot()``) or a callable returning snapshots."""
    cfg = cfg or ServerConfig()
    app = web.Application(
        middlewares=[track, limit_body, authenticate, errors], client_max_size=int(cfg.max_request_bytes)
    )
    if web_config is not None:
        app[WEB] = web_config
        if web_config.headers:
            extra = dict(web_config.headers)

            async def add_headers(_: web.Request, resp: web.StreamResponse) -> None:
                for k, v in extra.items():
                    resp.headers.setdefault(k, v)

            app.on_response_prepare.append(add_headers)
    snapshot = snapshot_fn(source)
    app[SNAPSHOT] = snapshot
    app[COUNTERS] = snapshot().http
    app[CFG] = cfg
    app[REGISTRY] = registry if registry is not None else make_registry(snapshot)
    app[LOGGED] = set()
    add_routes(app.router)
    return app


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all IPv4 interfaces); port 0 = any free."""
    text = listen.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"listen {listen!r}: expected [address]:port")
        port = rest[1:]
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"listen {listen!r}: expected host:port")
        if ":" in host:
            raise ValueError(f"listen {listen!r}: an IPv6 address needs brackets, e.g. [::1]:9478")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"listen {listen!r}: port must be 0..65535")
    return host or "0.0.0.0", int(port)


class Server:
    """A started server; ``close()`` stops it (open connections get one second)."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        listener: asyncio.AbstractServer | None = None,
        accept_errors: AcceptErrors | None = None,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.runner = runner
        self.host = host
        self.port = port
        self.listener = listener
        self.accept_errors = accept_errors
        self.guard = guard
        self.scheme = "http"

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        where = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{where}:{self.port}"

    async def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        try:
            await self.runner.cleanup()
            if self.listener is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.listener.wait_closed(), 2.0)
        finally:
            if self.accept_errors is not None:
                self.accept_errors.uninstall()


def load_server_web_config(cfg: ServerConfig) -> WebConfig | None:
    """``server.web_config`` loaded and checked; raises ``ValueError`` naming the file and key
    (the server then does not start: never plain HTTP where TLS was asked for)."""
    if not cfg.web_config:
        return None
    # Imported here: an agent without a web config never loads its module (TLS, bcrypt, hmac).
    from rankwatch.server.webconfig import WebConfigError, load_web_config

    web_cfg = load_web_config(cfg.web_config)
    if web_cfg.users and cfg.metrics_token:
        raise WebConfigError(
            f"{cfg.web_config}: basic_auth_users and server.metrics_token both guard /metrics: keep one"
        )
    return web_cfg


async def start_server(
    source: Source, cfg: ServerConfig, *, registry: CollectorRegistry | None = None
) -> Server:
    """Listen on ``cfg.listen``; raises ``ValueError`` (bad address) or ``OSError`` (bind).
    ``source`` as for ``make_app``."""
    host, port = parse_listen(cfg.listen)
    web_cfg = load_server_web_config(cfg)
    cfg, token_file = with_token(cfg)
    idle = float(cfg.idle_timeout)
    handler_kwargs: dict[str, Any] = {
        "access_log": None,
        "keepalive_timeout": idle,  # aiohttp also applies it before a connection's first request
        "max_line_size": MAX_REQUEST_LINE,
        "max_field_size": MAX_HEADER_FIELD,
        "max_headers": MAX_HEADERS,
        "lingering_time": min(idle, 10.0),
    }
    app = make_app(source, cfg, registry=registry, web_config=web_cfg)
    counters = app[COUNTERS]
    counters.serving = True  # its counts are exported from now on
    counts = counters.dropped
    guard = ConnectionGuard(connection_cap(int(cfg.max_connections)), counts)
    app[GUARD] = guard
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0, **handler_kwargs)
    await runner.setup()
    manager = runner.server
    assert manager is not None
    loop = asyncio.get_running_loop()
    on_reject = rejecter(counters.rejected)

    def factory() -> web.RequestHandler:
        return Protocol(manager, guard, on_reject, loop=loop, **handler_kwargs)

    accept_errors = AcceptErrors(loop, guard, counts)
    # asyncio accepts up to ``backlog`` connections per loop turn: at half the cap, a burst of
    # idle connections cannot evict a scrape's connection before its request has been read.
    backlog = max(16, min(128, guard.cap // 2))
    try:
        tls = web_cfg.ssl if web_cfg is not None else None
        listener = await loop.create_server(factory, host, port, reuse_address=True, backlog=backlog, ssl=tls)
    except BaseException:
        await runner.cleanup()
        raise
    loop.set_exception_handler(accept_errors)
    sockets = listener.sockets or ()
    bound = sockets[0].getsockname()[1] if sockets else port
    scheme = "https" if web_cfg is not None and web_cfg.ssl is not None else "http"
    log.info("serving metrics and API on %s:%d", host, bound)
    if web_cfg is not None:
        log.info(
            "web config %s: %s%s",
            web_cfg.path,
            "HTTPS only" if web_cfg.ssl is not None else "no TLS",
            f", basic auth on /metrics ({len(web_cfg.users)} user(s))" if web_cfg.users else "",
        )
    if token_file is not None:
        log.info(
            "status page and /api/* need the token in %s (rankwatch url / rankwatch top read it)", token_file
        )
    warning = exposure_warning(cfg, host)
    if warning:
        log.warning("%s", warning)
    server = Server(runner, host, bound, listener=listener, accept_errors=accept_errors, guard=guard)
    server.scheme = scheme
    return server
