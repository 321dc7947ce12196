"""The connection side of the server: request-line and header limits, bodies, and the
connection guard. These act before any authentication, so a stranger must not be able to
fill the log: an unparsable request gets 414 (request line over ``MAX_REQUEST_LINE``), 431
(a header over ``MAX_HEADER_FIELD``, or too many) or 400, with one log line for the first and
a count for the rest (``HttpCounters.rejected``); a body beyond ``max_request_bytes`` is 413
whatever the route.

Connections are bounded: at most ``max_connections`` at once (a new one beyond it closes the
longest-idle one, or itself when all are busy), and one with no request in progress (idle
keep-alive, headers or a body still arriving) is closed after ``idle_timeout``. When the
process runs out of file descriptors anyway, asyncio's "socket.accept() out of system
resource" is logged once and counted, and idle connections are shed so that /metrics and
/healthz get through again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections import OrderedDict
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from rankwatch.server.keys import CFG, Handler, error_reply

log = logging.getLogger("rankwatch.server")

# aiohttp's own limits (its public ``max_line_size``/``max_field_size``/``max_headers``), and
# the ones HeadScanner holds the raw bytes against to tell 414 from 431.
MAX_REQUEST_LINE = 8192
MAX_HEADER_FIELD = 8190
MAX_HEADERS = 128


MAX_REQUEST_LINE = 8192
MAX_HEADER_FIELD = 8190
MAX_HEADERS = 128


@web.middleware
async def limit_body(request: web.Request, handler: Handler) -> web.StreamResponse:
    cap = int(request.app[CFG].max_request_bytes)
    n = request.content_length
    if n is not None and n > cap:
        return error_reply(413, f"request body over {cap} bytes", {"Connection": "close"})
    if n is None and request.body_exists:  # chunked: count what arrives, up to the cap
        try:
            over = await asyncio.wait_for(_over_cap(request, cap), float(request.app[CFG].idle_timeout))
        except asyncio.TimeoutError:
            return error_reply(408, "request body did not arrive in time", {"Connection": "close"})
        if over:
            return error_reply(413, f"request body over {cap} bytes", {"Connection": "close"})
    return await handler(request)


async def _over_cap(request: web.Request, cap: int) -> bool:
    total = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        total += len(chunk)
        if total > cap:
            return True
    return False


class HeadScanner:
    """Which limit a connection's bytes broke first, read from the bytes themselves: a request
    line over ``MAX_REQUEST_LINE`` (414), a header line over ``MAX_HEADER_FIELD`` or more than
    ``MAX_HEADERS`` headers (431). aiohttp refuses all three as one ``BadHttpMessage`` whose
    wording and arguments are not its API, so the verdict comes from here.

    It follows line ends only: the first non-empty line of a message is its request line, the
    next ones its headers up to an empty line, then ``Content-Length`` bytes of body. A chunked
    body is not followed: the scanner stops (``verdict`` stays None). It stops at the first
    overflow too: aiohttp stops parsing there as well, and the connection is closed.
    """

    __slots__ = ("_blind", "_body", "_first", "_head", "_headers", "_len", "_length", "verdict")

    def __init__(self) -> None:
        self.verdict: int | None = None
        self._first = True  # the current line is (or precedes) a request line
        self._len = 0  # bytes of the current line so far, CR included
        self._head = b""  # its first bytes, enough to see a Content-Length / Transfer-Encoding
        self._headers = 0
        self._length = 0  # this message's Content-Length
        self._body = 0  # body bytes still to skip
        self._blind = False

    def feed(self, data: bytes) -> None:
        pos, n = 0, len(data)
        while pos < n and self.verdict is None and not self._blind:
            if self._body:
                step = min(self._body, n - pos)
                self._body -= step
                pos += step
                continue
            end = data.find(b"\n", pos)
            stop = n if end < 0 else end
            if len(self._head) < 32:
                self._head += data[pos : min(stop, pos + 32 - len(self._head))]
            self._len += stop - pos
            limit = MAX_REQUEST_LINE if self._first else MAX_HEADER_FIELD
            if self._len > limit + 1:  # + the CR before the LF
                self.verdict = 414 if self._first else 431
                return
            if end < 0:
                return
            self._line_ended()
            pos = end + 1

    def _line_ended(self) -> None:
        blank = self._len <= 1
        head = self._head.lower()
        self._len, self._head = 0, b""
        if self._first:
            if not blank:  # an empty line before a request line is allowed (RFC 9112 2.2)
                self._first, self._headers, self._length = False, 0, 0
            return
        if blank:  # the end of the head
            self._first, self._body = True, self._length
            return
        self._headers += 1
        if self._headers > MAX_HEADERS:
            self.verdict = 431
        elif head.startswith(b"content-length:"):
            value = head.partition(b":")[2].strip().rstrip(b"\r")
            self._length = int(value) if value.isdigit() else 0
        elif head.startswith(b"transfer-encoding:"):
            self._blind = True


class Protocol(web.RequestHandler):
    """aiohttp's connection handler, built here rather than by ``web.Server`` so that it can
    (1) answer an unparsable request with a counted status instead of a logged traceback and
    (2) report its connection to the :class:`ConnectionGuard`. Its bytes also go through a
    :class:`HeadScanner`, which names the limit a refused request broke."""

    __slots__ = ("_rw_guard", "_rw_head", "_rw_reject")

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
        self._rw_head = HeadScanner()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._rw_guard.admit(self)

    def data_received(self, data: bytes) -> None:
        self._rw_head.feed(data)
        super().data_received(data)

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
        code = self._rw_head.verdict or 400  # LineTooLong for a chunk-size line, say: 400
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
async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
    guard = request.app.get(GUARD)
    proto = request.protocol
    if guard is None or proto is None:
        return await handler(request)
    guard.busy(proto)
    try:
        return await handler(request)
    finally:
        guard.done(proto)


def rejecter(counts: dict[int, int]) -> Callable[[int, Any, BaseException], None]:
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


class AcceptErrors:
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
