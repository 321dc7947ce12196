"""What the server's modules share: the application's keys and the JSON answer every route,
middleware and refusal gives (never cached: it may name paths, pids and findings)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from rankwatch.config.schema import ServerConfig
from rankwatch.server.status import json_safe
from rankwatch.snapshot import AgentSnapshot, HttpCounters, SnapshotFn

if TYPE_CHECKING:
    from rankwatch.server.webconfig import WebConfig

SNAPSHOT: web.AppKey[SnapshotFn] = web.AppKey("snapshot")
COUNTERS = web.AppKey("counters", HttpCounters)
CFG = web.AppKey("cfg", ServerConfig)
REGISTRY = web.AppKey("registry", CollectorRegistry)
LOGGED = web.AppKey("logged", set)
# Typed by annotation only: the web config's module is loaded only by an agent that has one.
WEB: web.AppKey[WebConfig] = web.AppKey("web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

NO_STORE = {"Cache-Control": "no-store"}


def json_reply(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    body = json.dumps(json_safe(doc), allow_nan=False, indent=1)
    return web.json_response(text=body, status=status, headers={**NO_STORE, **(headers or {})})


def error_reply(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_reply({"error": message, "status": status}, status, headers)


def snapshot_of(request: web.Request) -> AgentSnapshot:
    return request.app[SNAPSHOT]()
