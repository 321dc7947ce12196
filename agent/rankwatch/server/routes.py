"""The routes: /metrics, the health probes, the read-only JSON API, the status page, the
login form and an incident's report. Rendering /metrics for eight busy ranks with eight GPUs
and a checkpoint folder (~620 series) takes 6-10 ms (bench/bench_scrape.py), too little to be
worth a thread, which would also race the loop's appends to the rolling windows; file reads
for the dump routes go to a thread (``offloop.fs``) with a timeout, so a hung filesystem is a
503, never a stalled loop."""

from __future__ import annotations

import asyncio
import gzip
import hmac
import json
import logging
import re
from typing import Any
from urllib.parse import quote

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from rankwatch import offloop
from rankwatch.dumps.store import DumpStore
from rankwatch.sanitize import visible_lines
from rankwatch.server.auth import PAGE_CSP, login_page, refusal, signed_in
from rankwatch.server.keys import (
    CFG,
    COUNTERS,
    LOGGED,
    NO_STORE,
    REGISTRY,
    Handler,
    error_reply,
    json_reply,
    snapshot_of,
)
from rankwatch.server.status import (
    FINDINGS_DEFAULT,
    FINDINGS_MAX,
    findings_doc,
    incident_doc,
    ready,
    status_doc,
)

log = logging.getLogger("rankwatch.server")

_INCIDENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_RANK_RE = re.compile(r"^[0-9]{1,9}$")


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
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
        return error_reply(500, "internal error (see the agent's log)")


# --- handlers ----------------------------------------------------------------------------
async def metrics(request: web.Request) -> web.Response:
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encoder(request.app[REGISTRY])
    headers = {**NO_STORE, "Content-Type": content_type, "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        # Level 1 in the handler: ~0.3 ms for 100 KB and 5-8x smaller; aiohttp's own
        # compression hands bodies over 1 KiB to a thread, which doubled the scrape's p99.
        body = gzip.compress(body, compresslevel=1)
        headers["Content-Encoding"] = "gzip"
    return web.Response(body=body, headers=headers)


async def healthz(request: web.Request) -> web.Response:
    """Answered by the loop itself, with how late it has run lately (runtime.loopmon)."""
    snap = snapshot_of(request)
    loop = snap.loop
    ok, text = (loop.healthy, loop.health) if loop is not None else (True, "ok")
    if "loop" in snap.broken:
        ok, text = False, f"cannot read the event loop monitor: {snap.broken['loop']!r}"
    return web.Response(text=text + "\n", status=200 if ok else 503, headers=NO_STORE)


async def readyz(request: web.Request) -> web.Response:
    ok, reasons = ready(snapshot_of(request))
    if refusal(request) is not None:  # a probe needs the status; paths and pids need the token
        reasons = ["details with the token, or from loopback"]
    return json_reply({"ready": ok, "detail": reasons}, 200 if ok else 503)


async def api_status(request: web.Request) -> web.Response:
    return json_reply(status_doc(snapshot_of(request)))


async def login(request: web.Request) -> web.Response:
    """The login form's POST: a right token gets the session cookie and the page."""
    token = request.app[CFG].token
    if not token:
        raise web.HTTPSeeOther("/")
    try:
        form = await asyncio.wait_for(request.post(), float(request.app[CFG].idle_timeout))
    except (asyncio.TimeoutError, ValueError):
        return login_page(400, "The form did not arrive.")
    given = form.get("token")
    if isinstance(given, str) and hmac.compare_digest(given.strip().encode(), token.encode()):
        return signed_in(request, token)
    return login_page(401, "Wrong token.")


async def page(request: web.Request) -> web.Response:
    headers = {
        **NO_STORE,
        "Content-Security-Policy": PAGE_CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    from rankwatch.server.page import load_page_extras, render_page  # the page's first visit

    snap = snapshot_of(request)
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
        return error_reply(400, "active must be 0 or 1")
    kind = q.get("kind") or None
    if kind is not None and not re.fullmatch(r"[a-z0-9_]{1,64}", kind):
        return error_reply(400, "kind must be a finding kind such as nan_loss")
    doc = findings_doc(
        snapshot_of(request),
        limit=limit,
        active=active_raw in ("1", "true", "yes"),
        kind=kind,
        rank=rank,
    )
    return json_reply(doc)


def _store(request: web.Request) -> DumpStore:
    store = snapshot_of(request).dumps.store
    if store is None:
        raise web.HTTPNotFound(
            text=json.dumps({"error": "this agent keeps no dumps", "status": 404}),
            content_type="application/json",
        )
    return store


async def api_dumps(request: web.Request) -> web.Response:
    store = _store(request)
    try:
        infos = await offloop.fs(store.list_incidents, name="rankwatch-dumps-list")
    except asyncio.TimeoutError:
        return error_reply(503, "the dump store does not answer (a hung filesystem?)")
    return json_reply({"dir": str(store.root), "incidents": [incident_doc(i) for i in infos]})


def load_dump(store: DumpStore, incident: str, rank: int, text: bool) -> tuple[int, Any]:
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
        return error_reply(400, "invalid incident name")
    if not _RANK_RE.fullmatch(rank_s):
        return error_reply(400, "rank must be a non-negative integer")
    fmt = request.query.get("format", "json")
    if fmt not in ("json", "text"):
        return error_reply(400, "format must be json or text")
    store = _store(request)
    try:
        text = fmt == "text"
        status, doc = await offloop.fs(
            load_dump, store, incident, int(rank_s), text, name="rankwatch-dumps-read"
        )
    except asyncio.TimeoutError:
        return error_reply(503, "the dump store does not answer (a hung filesystem?)")
    if status != 200:
        return error_reply(status, doc)
    if fmt == "text":
        return web.Response(text=doc, headers=NO_STORE)
    return json_reply(doc)


def _incident_report(
    store: DumpStore, incident: str, run: str | None, findings: list[dict[str, Any]]
) -> tuple[int, str]:
    """(HTTP status, page or why not); blocking, run in a thread. Read as ``api_dump`` reads."""
    from rankwatch.report import build_report, render_html  # on the first report asked for

    try:
        info = store.find(incident, run=run, allow_path=False)
    except KeyError as e:
        return 404, str(e.args[0] if e.args else e)
    rep = build_report(store, info, findings=findings, findings_source="this agent's recent findings")
    if not rep.ranks:
        return 404, f"incident {info.name} holds no rank dumps or traces"
    link = f"../api/dumps/{quote(info.name, safe='')}/{{}}?format=text"
    return 200, render_html(rep, link=link.format)


async def incident_page(request: web.Request) -> web.Response:
    """``/incidents/<incident>``: the incident's report (``rankwatch report``), same renderer."""
    incident = request.match_info["incident"]
    run = request.query.get("run") or None
    bad_run = run is not None and not _INCIDENT_RE.fullmatch(run.replace(".", "_"))
    if not _INCIDENT_RE.fullmatch(incident) or bad_run:
        return error_reply(400, "invalid incident name")
    store = _store(request)
    found = findings_doc(snapshot_of(request), limit=FINDINGS_MAX)["findings"]
    try:
        status, body = await offloop.fs(_incident_report, store, incident, run, found, name="rankwatch-dumps")
    except asyncio.TimeoutError:
        return error_reply(503, "the dump store does not answer (a hung filesystem?)")
    if status != 200:
        return error_reply(status, body)
    headers = {
        **NO_STORE,
        "Content-Security-Policy": PAGE_CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    return web.Response(text=body, content_type="text/html", headers=headers)


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/", page)
    router.add_post("/login", login)
    router.add_get("/metrics", metrics)
    router.add_get("/healthz", healthz)
    router.add_get("/readyz", readyz)
    router.add_get("/api/status", api_status)
    router.add_get("/api/findings", api_findings)
    router.add_get("/api/dumps", api_dumps)
    router.add_get("/api/dumps/{incident}/{rank}", api_dump)
    router.add_get("/incidents/{incident}", incident_page)
