"""Shared pieces of the fault-injection suite: a live agent in-process, a fake Slack Web API
that can be taken down, /metrics parsing, and (from conftest) the fake clock and bounded waits."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import re
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

# the shared helpers live in tests/conftest.py; importers of faultlib keep getting them here
from conftest import FakeClock, free_port, until, wait_for  # noqa: F401
from rankwatch.config.schema import Config
from rankwatch.identity import Identity
from rankwatch.records import Finding
from rankwatch.runtime.modes import watch_processes
from rankwatch.runtime.services import Services

IDENT = Identity(run="faults", rank=0, local_rank=0, world_size=1, node="n1")


@dataclass
class Recorder:
    """A findings sink: what the agent reported, in order."""

    findings: list[Finding] = field(default_factory=list)

    def send(self, f: Finding) -> None:
        self.findings.append(f)

    def kinds(self, *, active: bool = True) -> list[str]:
        return [f.kind for f in self.findings if not (active and f.resolved)]


_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$")


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    found = None
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m[1] != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            assert found is None, f"{name}{labels} matches more than one sample"
            found = float(m[3])
    return found


async def scrape(svc: Services) -> str:
    async with aiohttp.ClientSession() as http, http.get(svc.server.url + "/metrics") as r:
        assert r.status == 200
        return await r.text()


@dataclass
class Live:
    svc: Services
    stop: asyncio.Event
    recorder: Recorder

    @property
    def watcher(self) -> Any:
        return self.svc.agent.watchers[0]

    async def metrics(self) -> str:
        return await scrape(self.svc)


@asynccontextmanager
async def live_watch(
    cfg: Config,
    logs: list[Path],
    *,
    pids: list[int] | None = None,
    may_stop: bool = False,
    **services: Any,
) -> AsyncIterator[Live]:
    """``rankwatch watch`` in this process (the real code path), with its HTTP server.

    ``may_stop``: the agent may end on its own (every ``--pid`` it watched has exited)."""
    started: list[Services] = []
    stop = asyncio.Event()
    rec = Recorder()
    task = asyncio.create_task(
        watch_processes(
            cfg,
            IDENT,
            pids=pids or [],
            match=None,
            logs=logs,
            sinks=[rec],
            stop=stop,
            services={"on_start": started.append, **services},
        )
    )
    try:
        assert await until(lambda: bool(started) or task.done(), 20), "agent did not start"
        if task.done():
            task.result()
        yield Live(started[0], stop, rec)
        assert may_stop or not task.done(), "the agent stopped on its own"
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 30) == 0


# --- a Slack Web API that can be down ------------------------------------------------------
@dataclass
class FakeSlack:
    url: str = ""
    down: bool = False
    posted: list[dict[str, Any]] = field(default_factory=list)
    refused: int = 0


@asynccontextmanager
async def fake_slack() -> AsyncIterator[FakeSlack]:
    srv = FakeSlack()

    async def post(request: web.Request) -> web.Response:
        body = await request.json()
        if srv.down:
            srv.refused += 1
            return web.Response(status=503, text="Service Unavailable")
        srv.posted.append(body)
        return web.json_response({"ok": True, "channel": "C1", "ts": f"{len(srv.posted)}.000100"})

    app = web.Application()
    app.router.add_post("/api/chat.postMessage", post)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    srv.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield srv
    finally:
        await runner.cleanup()


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every live one, then wait for each (bounded), SIGKILL what does not go."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def cut_reader(nbytes: int) -> Callable[..., subprocess.Popen[bytes]]:
    """A stand-in for ``sources.prefetch._start`` whose child's stream ends after ``nbytes``,
    as if the reading process were killed mid-batch."""
    import shlex
    import sys

    from rankwatch.sources import prefetch

    def cut(fd: int, limit: int, label: str, offset: int, kind: str | None = None) -> subprocess.Popen[bytes]:
        here = str(Path(prefetch.__file__).resolve().parents[2])
        args = [here, str(fd), str(limit), label, str(offset), *([kind] if kind else [])]
        child = shlex.join([sys.executable, "-I", "-c", prefetch._CHILD, *args])
        return subprocess.Popen(
            ["sh", "-c", f"{child} | head -c {nbytes}"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            pass_fds=(fd,),
        )

    return cut


class _Hook(http.server.BaseHTTPRequestHandler):
    posted: list[str]

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self.posted.append(self.rfile.read(n).decode(errors="replace"))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: Any) -> None:
        pass


@contextlib.contextmanager
def webhook() -> Iterator[tuple[str, list[str]]]:
    """A loopback webhook receiver: its URL and the bodies posted to it, in order."""
    posted: list[str] = []
    handler = type("Hook", (_Hook,), {"posted": posted})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/hook", posted
    finally:
        srv.shutdown()
        srv.server_close()
