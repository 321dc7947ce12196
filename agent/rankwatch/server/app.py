"""The agent's HTTP server: /metrics, health probes, a read-only JSON API, a status page.

It runs on the agent's event loop and reads only snapshots of the agent
(``rankwatch.snapshot``), taken by a callable the runtime hands it; it writes only its
own counters (``HttpCounters``), so it needs no locks. Rendering /metrics for eight busy
ranks with eight GPUs and a checkpoint folder (~620 series) takes 6-10 ms
(bench/bench_scrape.py), too little to be worth a thread, which would also race the
loop's appends to the rolling windows. File reads for the dump routes go to a thread.
Everything is GET but the login form's POST; bodies are refused beyond
``max_request_bytes`` (413) whatever the route; a request line over ``MAX_REQUEST_LINE``
gets 414, a header over ``MAX_HEADER_FIELD`` (or too many) 431, other unparsable requests
400, each with one log line for the first and a count for the rest (``HttpCounters.rejected``):
these come before any authentication, so a stranger must not be able to fill the log.

Who may read what (secure by default, Prometheus keeps working across the network):
``/metrics`` (unless ``metrics_token``), ``/healthz`` and ``/readyz`` answer everyone. The
status page ``/`` and ``/api/*`` reveal code paths, command lines and, with ``dumps.locals``,
data: with ``server.token`` they need it (``Authorization: Bearer``, or the session cookie a
browser gets from ``/?token=...`` or the login form); without a token they answer only a
loopback peer that names a local host (127.0.0.1, ::1, ``kubectl port-forward``; a Host
that is a DNS name is refused, so a rebinding web page cannot read them through a
browser), and everyone else gets 403 saying how to open them. A bind on a non-loopback
address without a token is said once, loudly, at start.

Connections are bounded: at most ``max_connections`` at once (a new one beyond it closes
the longest-idle one, or itself when all are busy), and one with no request in progress
(idle keep-alive, headers or a body still arriving) is closed after ``idle_timeout``. When
the process runs out of file descriptors anyway, asyncio's "socket.accept() out of system
resource" is logged once and counted, and idle connections are shed so that /metrics and
/healthz get through again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import hashlib
import hmac
import html
import ipaddress
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from rankwatch import offloop
from rankwatch.config.schema import ServerConfig
from rankwatch.dumps.store import DumpStore
from rankwatch.exporter.metrics import make_registry
from rankwatch.sanitize import visible_lines
from rankwatch.server.status import (
    FINDINGS_DEFAULT,
    FINDINGS_MAX,
    findings_doc,
    incident_doc,
    json_safe,
    ready,
    status_doc,
)
from rankwatch.snapshot import AgentSnapshot, HttpCounters, SnapshotFn, Source, snapshot_fn

log = logging.getLogger("rankwatch.server")

SNAPSHOT: web.AppKey[SnapshotFn] = web.AppKey("snapshot")
COUNTERS = web.AppKey("counters", HttpCounters)
CFG = web.AppKey("cfg", ServerConfig)
REGISTRY = web.AppKey("registry", CollectorRegistry)
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


def _snapshot(request: web.Request) -> AgentSnapshot:
    return request.app[SNAPSHOT]()


# --- middlewares -------------------------------------------------------------------------
@web.middleware
async def _limit_body(request: web.Request, handler: Handler) -> web.StreamResponse:
    cap = int(request.app[CFG].max_request_bytes)
    n = request.content_length
    if n is not None and n > cap:
        return _error(413, f"request body over {cap} bytes", {"Connection": "close"})
    if n is None and request.body_exists:  # chunked: count what arrives, up to the cap
        try:
            over = await asyncio.wait_for(_over_cap(request, cap), float(request.app[CFG].idle_timeout))
        except asyncio.TimeoutError:
            return _error(408, "request body did not arrive in time", {"Connection": "close"})
        if over:
            return _error(413, f"request body over {cap} bytes", {"Connection": "close"})
    return await handler(request)


async def _over_cap(request: web.Request, cap: int) -> bool:
    total = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        total += len(chunk)
        if total > cap:
            return True
    return False


_PRIVATE_PATHS = ("/", "/login")
_PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
_LOCAL_NAMES = ("localhost", "localhost.", "ip6-localhost", "ip6-loopback")


def _private(path: str) -> bool:
    """Routes that reveal code or data: the status page and the JSON API."""
    return path in _PRIVATE_PATHS or path == "/api" or path.startswith("/api/")


def is_loopback_host(host: str) -> bool:
    """``127.0.0.1``, ``::1``, ``localhost``: an address only this machine can reach."""
    name = host.strip("[]").split("%", 1)[0]
    if name.lower() in _LOCAL_NAMES or name.lower().endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _peer_is_loopback(request: web.Request) -> bool:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, (tuple, list)) and peer:
        return is_loopback_host(str(peer[0]))
    return isinstance(peer, str)  # a Unix socket: only this machine


def _host_is_local(request: web.Request) -> bool:
    """The Host header names a loopback address or is an IP literal: never a DNS name that a
    web page could rebind to 127.0.0.1 to read the API through a local browser."""
    host = request.headers.get("Host", "")
    if not host:
        return True  # HTTP/1.0 without Host: not a browser, so not a rebinding page
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    else:
        name = host.rpartition(":")[0] if host.count(":") == 1 else host
    if is_loopback_host(name):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _bearer_ok(request: web.Request, token: str) -> bool:
    scheme, _, cred = request.headers.get("Authorization", "").partition(" ")
    ok_scheme = hmac.compare_digest(scheme.lower().encode(), b"bearer")
    return hmac.compare_digest(cred.strip().encode(), token.encode()) and ok_scheme


def session_value(token: str) -> str:
    """The cookie a browser holds after logging in: derived from the token, never the token
    itself, so a cookie read off a disk does not open other agents that share the token."""
    return hmac.new(token.encode(), b"rankwatch status page session v1", hashlib.sha256).hexdigest()


def _cookie_name(request: web.Request) -> str:
    # Browsers share cookies across the ports of one host, and a node runs one agent per
    # local rank (9478, 9479, ...): one cookie per port keeps their sessions apart.
    transport = request.transport
    sock = transport.get_extra_info("sockname") if transport is not None else None
    port = sock[1] if isinstance(sock, (tuple, list)) and len(sock) > 1 else 0
    return f"rankwatch_session_{port}"


def _cookie_ok(request: web.Request, token: str) -> bool:
    got = request.cookies.get(_cookie_name(request), "")
    return hmac.compare_digest(got.encode(), session_value(token).encode())


def _wants_html(request: web.Request) -> bool:
    return request.path in _PRIVATE_PATHS and "text/html" in request.headers.get("Accept", "")


def _login_page(status: int, note: str) -> web.Response:
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>rankwatch: sign in</title>'
        "<style>body{font:14px system-ui,sans-serif;margin:2em}input{font:inherit;padding:.3em}</style>"
        f'</head><body><h1>rankwatch</h1><p>{html.escape(note)}</p><form method="post" action="/login">'
        '<label>Token <input type="password" name="token" autocomplete="current-password" autofocus>'
        '</label> <button type="submit">Open</button></form>'
        '<p style="color:#777">The token is the agent\'s <code>server.token</code> '
        "(<code>$RANKWATCH_TOKEN</code>). Scripts send <code>Authorization: Bearer &lt;token&gt;</code>."
        "</p></body></html>"
    )
    headers = {**_NO_STORE, "Content-Security-Policy": _PAGE_CSP, "X-Content-Type-Options": "nosniff"}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="rankwatch"'
    return web.Response(text=body, status=status, content_type="text/html", headers=headers)


def _signed_in(request: web.Request, token: str) -> web.Response:
    """303 to the status page with the session cookie (the token leaves the address bar)."""
    resp = web.Response(status=303, headers={**_NO_STORE, "Location": "/", "Referrer-Policy": "no-referrer"})
    resp.set_cookie(_cookie_name(request), session_value(token), path="/", httponly=True, samesite="Strict")
    return resp


def _unauthorised(request: web.Request, note: str = "bearer token required") -> web.Response:
    if _wants_html(request):
        return _login_page(401, "This agent needs its token to show the status page.")
    given = "Authorization" in request.headers
    challenge = 'Bearer realm="rankwatch"' + (', error="invalid_token"' if given else "")
    return _error(401, note, {"WWW-Authenticate": challenge})


_LOOPBACK_ONLY = (
    "the status page and /api/* answer only on loopback while server.token is unset: set "
    "server.token (${RANKWATCH_TOKEN}) to open them to the network, or use an SSH tunnel / "
    "kubectl port-forward to 127.0.0.1"
)


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    cfg = request.app[CFG]
    path = request.path
    if path == "/metrics":
        if cfg.metrics_token and not _bearer_ok(request, cfg.metrics_token):
            return _unauthorised(request)
        return await handler(request)
    if not _private(path):
        return await handler(request)
    refusal = _refusal(request)
    if refusal is None or (path == "/login" and cfg.token):
        return await handler(request)
    if cfg.token and path == "/" and "token" in request.query:
        if hmac.compare_digest(request.query["token"].encode(), cfg.token.encode()):
            return _signed_in(request, cfg.token)
        return _login_page(401, "Wrong token.")
    return refusal


def _refusal(request: web.Request) -> web.Response | None:
    """Why this request may not read the page or the API, as the answer to give; None: it may."""
    token = request.app[CFG].token
    if token:
        if _bearer_ok(request, token) or _cookie_ok(request, token):
            return None
        return _unauthorised(request)
    if not _peer_is_loopback(request):
        if _wants_html(request):
            return _login_page(403, _LOOPBACK_ONLY.capitalize() + ".")
        return _error(403, _LOOPBACK_ONLY)
    if not _host_is_local(request):
        return _error(403, "a loopback request must name a local host (127.0.0.1, [::1], localhost)")
    return None


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        resource = request.match_info.route.resource
        name = resource.canonical if resource is not None else request.path
        request.app[COUNTERS].errors += 1
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
    snap = _snapshot(request)
    loop = snap.loop
    ok, text = (loop.healthy, loop.health) if loop is not None else (True, "ok")
    if "loop" in snap.broken:
        ok, text = False, f"cannot read the event loop monitor: {snap.broken['loop']!r}"
    return web.Response(text=text + "\n", status=200 if ok else 503, headers=_NO_STORE)


async def readyz(request: web.Request) -> web.Response:
    ok, reasons = ready(_snapshot(request))
    if _refusal(request) is not None:  # a probe needs the status; paths and pids need the token
        reasons = ["details with the token, or from loopback"]
    return _json({"ready": ok, "detail": reasons}, 200 if ok else 503)


async def api_status(request: web.Request) -> web.Response:
    return _json(status_doc(_snapshot(request)))


async def login(request: web.Request) -> web.Response:
    """The login form's POST: a right token gets the session cookie and the page."""
    token = request.app[CFG].token
    if not token:
        raise web.HTTPSeeOther("/")
    try:
        form = await asyncio.wait_for(request.post(), float(request.app[CFG].idle_timeout))
    except (asyncio.TimeoutError, ValueError):
        return _login_page(400, "The form did not arrive.")
    given = form.get("token")
    if isinstance(given, str) and hmac.compare_digest(given.strip().encode(), token.encode()):
        return _signed_in(request, token)
    return _login_page(401, "Wrong token.")


async def page(request: web.Request) -> web.Response:
    headers = {
        **_NO_STORE,
        "Content-Security-Policy": _PAGE_CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    from rankwatch.server.page import load_page_extras, render_page  # the page's first visit

    snap = _snapshot(request)
    extras = await load_page_extras(snap)
    html = render_page(status_doc(snap), extras)
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
    doc = findings_doc(
        _snapshot(request),
        limit=limit,
        active=active_raw in ("1", "true", "yes"),
        kind=kind,
        rank=rank,
    )
    return _json(doc)


def _store(request: web.Request) -> DumpStore:
    store = _snapshot(request).dumps.store
    if store is None:
        raise web.HTTPNotFound(
            text=json.dumps({"error": "this agent keeps no dumps", "status": 404}),
            content_type="application/json",
        )
    return store


async def api_dumps(request: web.Request) -> web.Response:
    store = _store(request)
    try:
        infos = await offloop.fs(store.list_incidents, name="rankwatch-dumps")
    except asyncio.TimeoutError:
        return _error(503, "the dump store does not answer (a hung filesystem?)")
    return _json({"dir": str(store.root), "incidents": [incident_doc(i) for i in infos]})


def _load_dump(store: DumpStore, incident: str, rank: int, text: bool) -> tuple[int, Any]:
    """(HTTP status, document or text); blocking, run in a thread.

    Only regular files inside the incident folder are served: the store walks from its
    root without following symlinks and refuses FIFOs and devices (``safeio``); anything
    refused is a 404 like a missing dump, and nothing of it is read."""
    try:
        info = store.find(incident, allow_path=False)
    except KeyError as e:
        return 404, str(e.args[0] if e.args else e)
    missing = f"incident {info.name} has no dump of rank {rank} (ranks: {info.ranks})"
    if rank not in info.ranks:
        return 404, missing
    try:
        if text:  # read by people (a browser, curl in a terminal): shown, never obeyed
            try:
                return 200, visible_lines(store.read_file(info, f"rank-{rank}.txt").decode(errors="replace"))
            except FileNotFoundError:
                return 200, visible_lines(store.load_rank(info, rank, strict=True).get("text", ""))
        return 200, store.load_rank(info, rank, strict=True)
    except OSError:  # safeio.Refused, or the folder swapped since it was listed
        return 404, missing


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
    store = _store(request)
    try:
        text = fmt == "text"
        status, doc = await offloop.fs(_load_dump, store, incident, int(rank_s), text, name="rankwatch-dumps")
    except asyncio.TimeoutError:
        return _error(503, "the dump store does not answer (a hung filesystem?)")
    if status != 200:
        return _error(status, doc)
    if fmt == "text":
        return web.Response(text=doc, headers=_NO_STORE)
    return _json(doc)


# --- assembly ----------------------------------------------------------------------------
def make_app(
    source: Source, cfg: ServerConfig | None = None, *, registry: CollectorRegistry | None = None
) -> web.Application:
    """The application without a listener (tests use aiohttp's test client on it).
    ``source``: the agent (anything with ``snapshot()``) or a callable returning snapshots."""
    cfg = cfg or ServerConfig()
    app = web.Application(
        middlewares=[_track, _limit_body, _auth, _errors], client_max_size=int(cfg.max_request_bytes)
    )
    snapshot = snapshot_fn(source)
    app[SNAPSHOT] = snapshot
    app[COUNTERS] = snapshot().http
    app[CFG] = cfg
    app[REGISTRY] = registry if registry is not None else make_registry(snapshot)
    app[LOGGED] = set()
    r = app.router
    r.add_get("/", page)
    r.add_post("/login", login)
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


class _Protocol(web.RequestHandler):
    """aiohttp's connection handler, built here rather than by ``web.Server`` so that it can
    (1) answer an unparsable request with a counted status instead of a logged traceback and
    (2) report its connection to the :class:`ConnectionGuard`."""

    __slots__ = ("_rw_guard", "_rw_reject")

    def __init__(
        self,
        manager: web.Server,
        guard: ConnectionGuard,
        on_reject: Callable[[int, Any, BaseException], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._rw_guard = guard
        self._rw_reject = on_reject

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._rw_guard.admit(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._rw_guard.forget(self)
        super().connection_lost(exc)

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
        self._rw_reject(code, request, exc)
        resp = web.Response(status=code, text=f"{code} {HTTPStatus(code).phrase}\n")
        resp.force_close()
        return resp


class ConnectionGuard:
    """Open connections, oldest activity first, and which of them are inside a handler.

    A new connection beyond ``cap`` closes the connection idle the longest (a keep-alive
    nobody uses, or a client still "sending" its headers); when every connection is busy the
    new one is closed instead. Either way the agent's descriptors stay bounded and a scrape
    gets through. Counts go to ``counts`` (``HttpCounters.dropped``) by reason.
    """

    def __init__(self, cap: int, counts: dict[str, int]) -> None:
        self.cap = max(1, int(cap))
        self.counts = counts
        self._open: OrderedDict[web.RequestHandler, None] = OrderedDict()
        self._busy: dict[web.RequestHandler, int] = {}
        self._logged = False

    def __len__(self) -> int:
        return len(self._open)

    def _count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        if not self._logged:
            self._logged = True
            log.warning(
                "more than %d HTTP connections at once: closing the longest-idle ones (server."
                "max_connections); further ones only counted in rankwatch_http_connections_dropped_total",
                self.cap,
            )

    def _idle(self) -> web.RequestHandler | None:
        return next((p for p in self._open if p not in self._busy), None)

    def admit(self, proto: web.RequestHandler) -> None:
        while len(self._open) >= self.cap:
            victim = self._idle()
            if victim is None:
                self._count("all_busy")
                proto.force_close()
                return
            self._close(victim)
            self._count("idle_evicted")
        self._open[proto] = None

    def _close(self, proto: web.RequestHandler) -> None:
        self._open.pop(proto, None)
        proto.force_close()
        transport = proto.transport
        if transport is not None:
            transport.close()

    def shed(self) -> int:
        """Descriptors ran out: lower the cap to half the connections open now (never below 4)
        and close the longest-idle ones down to it, so that the rest of the agent (log files,
        findings, dumps) gets descriptors again and later connections evict instead of failing."""
        self.cap = max(4, min(self.cap, len(self._open) // 2))
        idle = [p for p in self._open if p not in self._busy]
        victims = idle[: max(0, len(self._open) - self.cap)] or idle[:1]
        for p in victims:
            self._close(p)
        self.counts["shed_on_emfile"] = self.counts.get("shed_on_emfile", 0) + len(victims)
        return len(victims)

    def forget(self, proto: web.RequestHandler) -> None:
        self._open.pop(proto, None)
        self._busy.pop(proto, None)

    def busy(self, proto: web.RequestHandler) -> None:
        self._busy[proto] = self._busy.get(proto, 0) + 1

    def done(self, proto: web.RequestHandler) -> None:
        n = self._busy.pop(proto, 0) - 1
        if n > 0:
            self._busy[proto] = n
        if proto in self._open:
            self._open.move_to_end(proto)  # most recently active: evicted last


GUARD = web.AppKey("guard", ConnectionGuard)


@web.middleware
async def _track(request: web.Request, handler: Handler) -> web.StreamResponse:
    guard = request.app.get(GUARD)
    proto = request.protocol
    if guard is None or proto is None:
        return await handler(request)
    guard.busy(proto)
    try:
        return await handler(request)
    finally:
        guard.done(proto)


def _rejecter(counts: dict[int, int]) -> Callable[[int, Any, BaseException], None]:
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


_ACCEPT_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class _AcceptErrors:
    """The loop's exception handler while the server runs: asyncio reports an accept() that
    failed for lack of descriptors with a traceback every time it retries (every second,
    for every listening socket); here that is one log line, a count, and idle connections
    shed so that the descriptors come back. Everything else goes to the previous handler."""

    def __init__(self, loop: asyncio.AbstractEventLoop, guard: ConnectionGuard, counts: dict[str, int]):
        self.loop = loop
        self.guard = guard
        self.counts = counts
        self.previous = loop.get_exception_handler()
        self.logged = False

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", ""))
        if isinstance(exc, OSError) and exc.errno in _ACCEPT_ERRORS and "accept" in message:
            self.counts["accept_failed"] = self.counts.get("accept_failed", 0) + 1
            shed = self.guard.shed()
            if not self.logged:
                self.logged = True
                log.error(
                    "HTTP server cannot accept connections: %s (open connections: %d, %d idle ones "
                    "closed, at most %d from now on); further failures only counted in "
                    'rankwatch_http_connections_dropped_total{reason="accept_failed"}',
                    exc.strerror or exc,
                    len(self.guard) + shed,
                    shed,
                    self.guard.cap,
                )
            return
        if self.previous is not None:
            self.previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def uninstall(self) -> None:
        if self.loop.get_exception_handler() is self:
            self.loop.set_exception_handler(self.previous)


class Server:
    """A started server; ``close()`` stops it (open connections get one second)."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        listener: asyncio.AbstractServer | None = None,
        accept_errors: _AcceptErrors | None = None,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.runner = runner
        self.host = host
        self.port = port
        self.listener = listener
        self.accept_errors = accept_errors
        self.guard = guard

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

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


def exposure_warning(cfg: ServerConfig, host: str) -> str | None:
    """The startup line for a bind that strangers can reach, or None on loopback."""
    if is_loopback_host(host or "0.0.0.0"):
        return None
    what = "/metrics, /healthz and /readyz" if not cfg.metrics_token else "/healthz and /readyz"
    if cfg.token:
        return None  # the production form: metrics open to Prometheus, the rest behind the token
    return (
        f"HTTP server on {host}: {what} are open to the network WITHOUT A TOKEN; the status page "
        "and /api/* (stacks, command lines, findings) answer only on loopback until server.token "
        "is set (${RANKWATCH_TOKEN})"
    )


def connection_cap(configured: int) -> int:
    """``server.max_connections``, but never more than a quarter of the process's descriptor
    limit: the HTTP server must leave the rest to logs, findings, dumps and the child."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return configured
    cap = max(4, int(soft) // 4)
    if configured > cap:
        log.info(
            "server.max_connections %d lowered to %d: a quarter of this process's %d file descriptors",
            configured,
            cap,
            soft,
        )
        return cap
    return configured


async def start_server(
    source: Source, cfg: ServerConfig, *, registry: CollectorRegistry | None = None
) -> Server:
    """Listen on ``cfg.listen``; raises ``ValueError`` (bad address) or ``OSError`` (bind).
    ``source`` as for ``make_app``."""
    host, port = parse_listen(cfg.listen)
    idle = float(cfg.idle_timeout)
    handler_kwargs: dict[str, Any] = {
        "access_log": None,
        "keepalive_timeout": idle,  # aiohttp also applies it before a connection's first request
        "max_line_size": MAX_REQUEST_LINE,
        "max_field_size": MAX_HEADER_FIELD,
        "max_headers": MAX_HEADERS,
        "lingering_time": min(idle, 10.0),
    }
    app = make_app(source, cfg, registry=registry)
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
    on_reject = _rejecter(counters.rejected)

    def factory() -> web.RequestHandler:
        return _Protocol(manager, guard, on_reject, loop=loop, **handler_kwargs)

    accept_errors = _AcceptErrors(loop, guard, counts)
    # asyncio accepts up to ``backlog`` connections per loop turn: at half the cap, a burst of
    # idle connections cannot evict a scrape's connection before its request has been read.
    backlog = max(16, min(128, guard.cap // 2))
    try:
        listener = await loop.create_server(factory, host, port, reuse_address=True, backlog=backlog)
    except BaseException:
        await runner.cleanup()
        raise
    loop.set_exception_handler(accept_errors)
    sockets = listener.sockets or ()
    bound = sockets[0].getsockname()[1] if sockets else port
    log.info("serving metrics and API on %s:%d", host, bound)
    warning = exposure_warning(cfg, host)
    if warning:
        log.warning("%s", warning)
    return Server(runner, host, bound, listener=listener, accept_errors=accept_errors, guard=guard)
