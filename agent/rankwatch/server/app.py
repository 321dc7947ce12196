"""The agent's HTTP server: /metrics, health probes, a read-only JSON API, a status page.

It runs on the agent's event loop and only reads agent state, so it needs no locks:
a handler never awaits between reading and answering. Rendering /metrics for eight busy
ranks with eight GPUs and a checkpoint folder (~620 series) takes 6-10 ms
(bench/bench_scrape.py), too little to be worth a thread, which would also race the
loop's appends to the rolling windows. File reads for the dump routes go to a thread.
Everything is GET; bodies are refused beyond
``max_request_bytes`` (413) whatever the route; a request line over ``MAX_REQUEST_LINE``
gets 414, a header over ``MAX_HEADER_FIELD`` (or too many) 431, other unparsable requests
400, each with one log line for the first and a count for the rest (``http_rejected``):
these come before any authentication, so a stranger must not be able to fill the log.
"""

from __future__ import annotations

import asyncio
import gzip
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from rankwatch.config.schema import ServerConfig
from rankwatch.exporter.findings import FindingTracker
from rankwatch.exporter.metrics import make_registry
from rankwatch.server.page import load_page_extras, render_page
from rankwatch.server.status import (
    FINDINGS_DEFAULT,
    FINDINGS_MAX,
    findings_doc,
    incident_doc,
    json_safe,
    ready,
    status_doc,
)

log = logging.getLogger("rankwatch.server")

AGENT = web.AppKey("agent", object)
CFG = web.AppKey("cfg", ServerConfig)
REGISTRY = web.AppKey("registry", CollectorRegistry)
TRACKER = web.AppKey("tracker", FindingTracker)
STARTED = web.AppKey("started", float)
LOGGED = web.AppKey("logged", set)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_INCIDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_RANK_RE = re.compile(r"^[0-9]{1,9}$")
_NO_STORE = {"Cache-Control": "no-store"}
# The two limits differ on purpose: aiohttp reports both overflows as the same error and
# the limit it names is what tells a long URL (414) from a long header (431).
MAX_REQUEST_LINE = 8192
MAX_HEADER_FIELD = 8190
MAX_HEADERS = 128


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    body = json.dumps(json_safe(doc), allow_nan=False, indent=1)
    return web.json_response(text=body, status=status, headers={**_NO_STORE, **(headers or {})})


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json({"error": message, "status": status}, status, headers)


def _count_error(agent: Any) -> None:
    errs = getattr(agent, "internal_errors_by_component", None)
    if errs is None:
        errs = {}
        try:
            agent.internal_errors_by_component = errs
        except AttributeError:
            return
    errs["server"] = errs.get("server", 0) + 1


# --- middlewares -------------------------------------------------------------------------
@web.middleware
async def _limit_body(request: web.Request, handler: Handler) -> web.StreamResponse:
    cap = int(request.app[CFG].max_request_bytes)
    n = request.content_length
    if n is not None and n > cap:
        return _error(413, f"request body over {cap} bytes", {"Connection": "close"})
    if n is None and request.body_exists:  # chunked: count what arrives, up to the cap
        total = 0
        async for chunk in request.content.iter_chunked(1 << 16):
            total += len(chunk)
            if total > cap:
                return _error(413, f"request body over {cap} bytes", {"Connection": "close"})
    return await handler(request)


def _token_for(cfg: ServerConfig, path: str) -> str | None:
    if path == "/metrics":
        return cfg.metrics_token
    if path == "/" or path == "/api" or path.startswith("/api/"):
        return cfg.token
    return None


def _authorised(request: web.Request, token: str) -> bool:
    scheme, _, cred = request.headers.get("Authorization", "").partition(" ")
    ok_scheme = hmac.compare_digest(scheme.lower().encode(), b"bearer")
    return hmac.compare_digest(cred.strip().encode(), token.encode()) and ok_scheme


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = _token_for(request.app[CFG], request.path)
    if token and not _authorised(request, token):
        given = "Authorization" in request.headers
        challenge = 'Bearer realm="rankwatch"' + (', error="invalid_token"' if given else "")
        return _error(401, "bearer token required", {"WWW-Authenticate": challenge})
    return await handler(request)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        resource = request.match_info.route.resource
        name = resource.canonical if resource is not None else request.path
        _count_error(request.app[AGENT])
        logged = request.app[LOGGED]
        if name not in logged:
            logged.add(name)
            log.exception("%s %s failed (further failures of this route only counted)", request.method, name)
        return _error(500, "internal error (see the agent's log)")


# --- handlers ----------------------------------------------------------------------------
async def metrics(request: web.Request) -> web.Response:
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encoder(request.app[REGISTRY])
    headers = {**_NO_STORE, "Content-Type": content_type, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        # Level 1 in the handler: ~0.3 ms for 100 KB and 5-8x smaller; aiohttp's own
        # compression hands bodies over 1 KiB to a thread, which doubled the scrape's p99.
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def healthz(request: web.Request) -> web.Response:
    """Answered by the loop itself, with how late it has run lately (runtime.loopmon)."""
    mon = getattr(request.app[AGENT], "loop_monitor", None)
    ok, text = mon.health() if mon is not None else (True, "ok")
    return web.Response(text=text + "\n", status=200 if ok else 503, headers=_NO_STORE)


async def readyz(request: web.Request) -> web.Response:
    ok, reasons = ready(request.app[AGENT])
    return _json({"ready": ok, "detail": reasons}, 200 if ok else 503)


def _status(request: web.Request) -> dict[str, Any]:
    app = request.app
    return status_doc(app[AGENT], app[TRACKER], started=app[STARTED])


async def api_status(request: web.Request) -> web.Response:
    return _json(_status(request))


async def page(request: web.Request) -> web.Response:
    headers = {
        **_NO_STORE,
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
        "X-Content-Type-Options": "nosniff",
    }
    extras = await load_page_extras(request.app[AGENT])
    html = render_page(_status(request), extras)
    return web.Response(text=html, content_type="text/html", headers=headers)


def _int_param(q: Any, name: str, default: int | None, lo: int, hi: int) -> int | None:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"[0-9]{1,9}", raw) or not lo <= int(raw) <= hi:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"{name} must be an integer in [{lo}, {hi}]", "status": 400}),
            content_type="application/json",
        )
    return int(raw)


async def api_findings(request: web.Request) -> web.Response:
    q = request.query
    limit = _int_param(q, "limit", FINDINGS_DEFAULT, 1, FINDINGS_MAX) or FINDINGS_DEFAULT
    rank = _int_param(q, "rank", None, 0, 10**9)
    active_raw = q.get("active", "0").lower()
    if active_raw not in ("0", "1", "true", "false", "yes", "no", ""):
        return _error(400, "active must be 0 or 1")
    kind = q.get("kind") or None
    if kind is not None and not re.fullmatch(r"[a-z0-9_]{1,64}", kind):
        return _error(400, "kind must be a finding kind such as nan_loss")
    app = request.app
    doc = findings_doc(
        app[AGENT],
        app[TRACKER],
        limit=limit,
        active=active_raw in ("1", "true", "yes"),
        kind=kind,
        rank=rank,
    )
    return _json(doc)


async def api_dumps(request: web.Request) -> web.Response:
    store = request.app[AGENT].store  # type: ignore[attr-defined]
    infos = await asyncio.to_thread(store.list_incidents)
    return _json({"dir": str(store.root), "incidents": [incident_doc(i) for i in infos]})


def _load_dump(store: Any, incident: str, rank: int, text: bool) -> tuple[int, Any]:
    """(HTTP status, document or text); blocking, run in a thread."""
    try:
        info = store.find(incident)
    except KeyError as e:
        return 404, str(e.args[0] if e.args else e)
    root = Path(store.root).resolve()
    if not Path(info.path).resolve().is_relative_to(root):
        return 404, f"no incident {incident!r} in the dump store"
    if rank not in info.ranks:
        return 404, f"incident {info.name} has no dump of rank {rank} (ranks: {info.ranks})"
    if text:
        try:
            return 200, (info.path / f"rank-{rank}.txt").read_text(errors="replace")
        except OSError:
            return 200, store.load_rank(info, rank).get("text", "")
    return 200, store.load_rank(info, rank)


async def api_dump(request: web.Request) -> web.Response:
    incident = request.match_info["incident"]
    rank_s = request.match_info["rank"]
    if not _INCIDENT_RE.fullmatch(incident):
        return _error(400, "invalid incident name")
    if not _RANK_RE.fullmatch(rank_s):
        return _error(400, "rank must be a non-negative integer")
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "text"):
        return _error(400, "format must be json or text")
    store = request.app[AGENT].store  # type: ignore[attr-defined]
    status, doc = await asyncio.to_thread(_load_dump, store, incident, int(rank_s), fmt == "text")
    if status != 200:
        return _error(status, doc)
    if fmt == "text":
        return web.Response(text=doc, headers=_NO_STORE)
    return _json(doc)


# --- assembly ----------------------------------------------------------------------------
def make_app(
    agent: Any, cfg: ServerConfig | None = None, *, registry: CollectorRegistry | None = None
) -> web.Application:
    """The application without a listener (tests use aiohttp's test client on it)."""
    cfg = cfg or ServerConfig()
    app = web.Application(
        middlewares=[_limit_body, _auth, _errors], client_max_size=int(cfg.max_request_bytes)
    )
    app[AGENT] = agent
    app[CFG] = cfg
    app[REGISTRY] = registry if registry is not None else make_registry(agent)
    app[TRACKER] = FindingTracker.of(agent)
    app[STARTED] = float(getattr(agent, "started_at", 0.0) or time.time())
    app[LOGGED] = set()
    r = app.router
    r.add_get("/", page)
    r.add_get("/metrics", metrics)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/api/status", api_status)
    r.add_get("/api/findings", api_findings)
    r.add_get("/api/dumps", api_dumps)
    r.add_get("/api/dumps/{incident}/{rank}", api_dump)
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


def _reject_status(exc: BadHttpMessage) -> int:
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else None
        if str(limit) == str(MAX_REQUEST_LINE):
            return 414
        if str(limit) == str(MAX_HEADER_FIELD):
            return 431
    return 431 if "too many headers" in str(exc).lower() else 400


class _QuietProtocol(web.RequestHandler):
    """aiohttp logs each unparsable request with a full traceback; here it is a counted status."""

    __slots__ = ()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, BadHttpMessage) or status != 400:
            return super().handle_error(request, status, exc, message)
        code = _reject_status(exc)
        on_reject = getattr(self._manager, "on_reject", None)
        if callable(on_reject):
            on_reject(code, request, exc)
        resp = web.Response(status=code, text=f"{code} {HTTPStatus(code).phrase}\n")
        resp.force_close()
        return resp


class _QuietServer(web.Server):
    on_reject: Callable[[int, Any, BaseException], None] | None = None

    def __call__(self) -> web.RequestHandler:
        proto = super().__call__()
        proto.__class__ = _QuietProtocol  # same layout (no new slots): only handle_error differs
        return proto


def _rejecter(agent: Any) -> Callable[[int, Any, BaseException], None]:
    counts: dict[int, int] = {}
    try:
        agent.http_rejected = counts  # by status, for the exporter and the status page
    except AttributeError:
        pass

    def on_reject(code: int, request: Any, exc: BaseException) -> None:
        counts[code] = counts.get(code, 0) + 1
        if sum(counts.values()) == 1:
            peer = getattr(request, "remote", None) or "?"
            log.warning(
                "refused a malformed HTTP request from %s with %d (%s); further ones only counted",
                peer,
                code,
                " ".join(str(getattr(exc, "message", exc)).split())[:100],
            )

    return on_reject


class Server:
    """A started server; ``close()`` stops it (open connections get one second)."""

    def __init__(self, runner: web.AppRunner, host: str, port: int) -> None:
        self.runner = runner
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_server(agent: Any, cfg: ServerConfig, *, registry: CollectorRegistry | None = None) -> Server:
    """Listen on ``cfg.listen``; raises ``ValueError`` (bad address) or ``OSError`` (bind)."""
    host, port = parse_listen(cfg.listen)
    runner = web.AppRunner(
        make_app(agent, cfg, registry=registry),
        access_log=None,
        handle_signals=False,
        shutdown_timeout=1.0,
        max_line_size=MAX_REQUEST_LINE,
        max_field_size=MAX_HEADER_FIELD,
        max_headers=MAX_HEADERS,
    )
    await runner.setup()
    server = runner.server
    if server is not None and type(server) is web.Server:
        server.__class__ = _QuietServer
        server.on_reject = _rejecter(agent)  # type: ignore[attr-defined]
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info("serving metrics and API on %s:%d", host, bound)
    return Server(runner, host, bound)
