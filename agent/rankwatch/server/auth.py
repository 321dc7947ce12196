"""Who may read what: ``/metrics`` (unless ``metrics_token`` or the web config's basic auth),
``/healthz`` and ``/readyz`` answer everyone. The status page ``/`` and ``/api/*`` reveal code
paths, command lines and, with ``dumps.locals``, data: they need the token (``Authorization:
Bearer``, or the session cookie a browser gets from ``/?token=...`` or the login form), from
loopback too — any user of a shared node can connect to 127.0.0.1. Without ``server.token`` a
started server uses this user's token from its runtime folder, made at start when there is none
(``tokenfile``; the CLI reads the same file). An application built without a token (``make_app``
alone, as tests do) answers only a loopback peer that names a local host (a Host that is a DNS
name is refused, so a rebinding web page cannot read it through a browser), and everyone else
gets 403.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import html
import ipaddress
import logging
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from rankwatch.config.schema import ServerConfig
from rankwatch.server.keys import CFG, NO_STORE, WEB, Handler, error_reply
from rankwatch.server.tokenfile import ensure_token

if TYPE_CHECKING:
    from rankwatch.server.webconfig import WebConfig

log = logging.getLogger("rankwatch.server")

_PRIVATE_PATHS = ("/", "/login")
PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'"
_LOCAL_NAMES = ("localhost", "localhost.", "ip6-localhost", "ip6-loopback")


def is_private_path(path: str) -> bool:
    """Routes that reveal code or data: the status page, an incident's report and the JSON API."""
    return path in _PRIVATE_PATHS or path == "/api" or path.startswith(("/api/", "/incidents/"))


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


async def _basic_ok(request: web.Request, web_cfg: WebConfig) -> bool:
    """``Authorization: Basic`` against the web config's ``basic_auth_users``."""
    scheme, _, cred = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, sep, password = base64.b64decode(cred.strip(), validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return False
    return bool(sep) and await web_cfg.check_basic(user, password)


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
    page = request.path in _PRIVATE_PATHS or request.path.startswith("/incidents/")
    return page and "text/html" in request.headers.get("Accept", "")


def login_page(status: int, note: str) -> web.Response:
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>rankwatch: sign in</title>'
        "<style>body{font:14px system-ui,sans-serif;margin:2em}input{font:inherit;padding:.3em}</style>"
        f'</head><body><h1>rankwatch</h1><p>{html.escape(note)}</p><form method="post" action="/login">'
        '<label>Token <input type="password" name="token" autocomplete="current-password" autofocus>'
        '</label> <button type="submit">Open</button></form>'
        '<p style="color:#777">The token is the agent\'s <code>server.token</code> '
        "(<code>$RANKWATCH_TOKEN</code>), or, when that is unset, the one in the runtime folder of the "
        "user who started it: <code>rankwatch url</code> prints the link. Scripts send "
        "<code>Authorization: Bearer &lt;token&gt;</code>."
        "</p></body></html>"
    )
    headers = {**NO_STORE, "Content-Security-Policy": PAGE_CSP, "X-Content-Type-Options": "nosniff"}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="rankwatch"'
    return web.Response(text=body, status=status, content_type="text/html", headers=headers)


def signed_in(request: web.Request, token: str) -> web.Response:
    """303 to the status page with the session cookie (the token leaves the address bar)."""
    resp = web.Response(status=303, headers={**NO_STORE, "Location": "/", "Referrer-Policy": "no-referrer"})
    resp.set_cookie(_cookie_name(request), session_value(token), path="/", httponly=True, samesite="Strict")
    return resp


def _unauthorised(request: web.Request, note: str = "bearer token required") -> web.Response:
    if _wants_html(request):
        return login_page(401, "This agent needs its token to show the status page.")
    given = "Authorization" in request.headers
    challenge = 'Bearer realm="rankwatch"' + (', error="invalid_token"' if given else "")
    return error_reply(401, note, {"WWW-Authenticate": challenge})


_LOOPBACK_ONLY = (
    "the status page and /api/* answer only on loopback while server.token is unset: set "
    "server.token (${RANKWATCH_TOKEN}) to open them to the network, or use an SSH tunnel / "
    "kubectl port-forward to 127.0.0.1"
)


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    cfg = request.app[CFG]
    path = request.path
    if path == "/metrics":
        web_cfg = request.app.get(WEB)
        if web_cfg is not None and web_cfg.users:
            if not await _basic_ok(request, web_cfg):
                return error_reply(
                    401, "basic auth required", {"WWW-Authenticate": 'Basic realm="rankwatch"'}
                )
        elif cfg.metrics_token and not _bearer_ok(request, cfg.metrics_token):
            return _unauthorised(request)
        return await handler(request)
    if not is_private_path(path):
        return await handler(request)
    refused = refusal(request)
    if refused is None or (path == "/login" and cfg.token):
        return await handler(request)
    if cfg.token and path == "/" and "token" in request.query:
        if hmac.compare_digest(request.query["token"].encode(), cfg.token.encode()):
            return signed_in(request, cfg.token)
        return login_page(401, "Wrong token.")
    return refused


def refusal(request: web.Request) -> web.Response | None:
    """Why this request may not read the page or the API, as the answer to give; None: it may."""
    token = request.app[CFG].token
    if token:
        if _bearer_ok(request, token) or _cookie_ok(request, token):
            return None
        return _unauthorised(request)
    if not _peer_is_loopback(request):
        if _wants_html(request):
            return login_page(403, _LOOPBACK_ONLY.capitalize() + ".")
        return error_reply(403, _LOOPBACK_ONLY)
    if not _host_is_local(request):
        return error_reply(403, "a loopback request must name a local host (127.0.0.1, [::1], localhost)")
    return None


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


def with_token(cfg: ServerConfig) -> tuple[ServerConfig, Path | None]:
    """``cfg`` with a token: the configured one, else this user's shared one from its runtime
    folder (made now if need be; ``tokenfile``), else — when that folder cannot be trusted or
    written — one held in memory only: the API is then closed, never open."""
    if cfg.token:
        return cfg, None
    try:
        token, path = ensure_token()
    except OSError as e:
        log.warning(
            "server.token is unset and no token file could be kept (%s): the status page and /api/* "
            "stay closed; set server.token (${RANKWATCH_TOKEN}) to open them",
            e,
        )
        return dataclasses.replace(cfg, token=secrets.token_urlsafe(32)), None
    return dataclasses.replace(cfg, token=token), path
