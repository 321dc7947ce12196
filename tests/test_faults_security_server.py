"""Attacks on the agent's HTTP server (issue 16 items 3 and 4, issue 20's browser login).

Secure by default: from the network only /metrics and the probes answer without a token;
the status page and /api/* need the token (Bearer, or the cookie a browser gets from
``/?token=``), or answer loopback only. Connections are bounded: idle sockets, half-sent
headers and slow bodies cannot exhaust descriptors or hold the server, and running out of
descriptors is one log line and a count, not a flood.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import resource
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from conftest import free_port
from rankwatch.config.schema import Config, ServerConfig
from rankwatch.config.snapshot import replaced
from rankwatch.identity import Identity
from rankwatch.records import StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.server import Server, make_app, start_server
from rankwatch.server.auth import exposure_warning, is_loopback_host, session_value

IDENT = Identity(run="t", rank=0, local_rank=0, world_size=1, node="n1")
TIMEOUT = aiohttp.ClientTimeout(total=10)
TOKEN = "s3cret-t0ken-for-the-page"
DROPPED = "rankwatch_http_connections_dropped_total"


def _agent(tmp_path: Path) -> Agent:
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, IDENT)
    log = tmp_path / "rank-0.log"
    log.touch()
    w = agent.add_watcher([log], dataclasses.replace(IDENT))
    w.streams[0].reader.fill()  # its log source's read (off the loop in the agent) opens it
    w._records([StepRecord(step=i, loss=2.0, time=time.time() - 10 + i / 10) for i in range(1, 50)])
    return agent


@contextlib.asynccontextmanager
async def _serve(agent: Agent, **cfg: Any) -> AsyncIterator[Server]:
    cfg.setdefault("listen", "127.0.0.1:0")
    server = await start_server(agent, ServerConfig(**cfg))
    try:
        yield server
    finally:
        await server.close()


def _run(fn: Callable[[], Awaitable[None]], limit: float = 60) -> None:
    asyncio.run(asyncio.wait_for(fn(), limit))


def _outside_address() -> str | None:
    """A non-loopback address of this machine, or None (a bare container with only lo)."""
    for probe in ("192.0.2.1", "10.255.255.255", "8.8.8.8"):
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((probe, 9))  # UDP: picks the route's source address, sends nothing
            addr = s.getsockname()[0]
            if not is_loopback_host(addr):
                return addr
    return None


# --- who may read what ---------------------------------------------------------------------
PRIVATE = ("/", "/api/status", "/api/findings", "/api/dumps", "/api/dumps/x/0", "/api")


@pytest.mark.process
def test_without_a_configured_token_loopback_needs_the_token_the_agent_made(
    tmp_path: Path, _private_runtime_dir: Path
) -> None:
    """Issue 26 item 10: any user of a shared node can reach 127.0.0.1, so stacks and command
    lines need a token there too; the agent makes one in its user's runtime folder."""
    agent = _agent(tmp_path)
    outside = _outside_address()

    async def go() -> None:
        async with _serve(agent, listen="0.0.0.0:0") as srv, aiohttp.ClientSession(timeout=TIMEOUT) as s:
            path = _private_runtime_dir / "rankwatch" / "token"
            st, folder = path.lstat(), path.parent.lstat()
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
            assert st.st_uid == os.geteuid()
            assert stat.S_IMODE(folder.st_mode) == 0o700 and folder.st_uid == os.geteuid()
            token = path.read_text().strip()
            assert len(token) >= 32
            auth = {"Authorization": f"Bearer {token}"}
            bases = [f"http://127.0.0.1:{srv.port}"] + ([f"http://{outside}:{srv.port}"] if outside else [])
            for base in bases:
                for open_path in ("/metrics", "/healthz", "/readyz"):
                    async with s.get(base + open_path) as r:
                        assert r.status == 200, (base, open_path)
                async with s.get(base + "/readyz") as r:
                    assert "rank 0" not in await r.text()  # probes get the status, not what is watched
                async with s.get(base + "/readyz", headers=auth) as r:
                    assert "rank 0" in await r.text()
                for private in PRIVATE:
                    async with s.get(base + private) as r:
                        body = await r.text()
                        assert r.status == 401, (base, private, r.status)
                        assert '"ranks"' not in body and "rank-0.log" not in body and "step" not in body
                    async with s.get(base + private, headers={"Authorization": "Bearer wrong"}) as r:
                        assert r.status == 401, (base, private)
                async with s.get(base + "/api/status", headers=auth) as r:
                    assert r.status == 200 and (await r.json())["ranks"]
                async with s.get(base + "/api/dumps", headers=auth) as r:
                    assert r.status == 200
                async with s.get(base + "/api/status", headers={"X-Forwarded-For": "127.0.0.1"}) as r:
                    assert r.status == 401
            # a second agent of the same user on this node shares the token (one file for the CLI)
            async with _serve(agent) as other, s.get(other.url + "/api/status", headers=auth) as r:
                assert r.status == 200
            assert path.read_text().strip() == token

    _run(go)


@pytest.mark.process
def test_an_untrusted_runtime_folder_keeps_the_api_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without XDG_RUNTIME_DIR the token goes to <tmp>/rankwatch-<uid>: in a 1777 /tmp another
    user can make that folder first. The agent refuses it and keeps the API closed."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)
    planted = shared / f"rankwatch-{os.geteuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # as another user would leave it to read what the agent writes
    agent = _agent(tmp_path)

    async def go() -> None:
        async with _serve(agent) as srv, aiohttp.ClientSession(timeout=TIMEOUT) as s:
            for private in PRIVATE:
                async with s.get(srv.url + private) as r:
                    assert r.status == 401, private
            async with s.get(srv.url + "/metrics") as r:
                assert r.status == 200

    with caplog.at_level(logging.INFO, logger="rankwatch.server"):
        _run(go)
    assert list(planted.iterdir()) == []  # nothing written into the other user's folder
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(planted) in m and "open to group or others" in m and "stay closed" in m for m in said)


@pytest.mark.process
def test_loopback_without_token_refuses_a_dns_name_in_host(tmp_path: Path) -> None:
    """An application built without a token (``make_app`` alone) answers loopback only, and
    a web page that rebinds its name to 127.0.0.1 must not read it via a local browser."""
    agent = _agent(tmp_path)

    async def go() -> None:
        server = TestServer(make_app(agent, ServerConfig()), host="127.0.0.1")
        await server.start_server()
        url = f"http://127.0.0.1:{server.port}"
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
                for host, want in (
                    ("evil.example:80", 403),
                    ("localhost", 200),
                    (f"127.0.0.1:{server.port}", 200),
                    ("app.localhost", 200),
                ):
                    async with s.get(url + "/api/status", headers={"Host": host}) as r:
                        assert r.status == want, host
                async with s.get(url + "/metrics", headers={"Host": "evil.example"}) as r:
                    assert r.status == 200  # metrics carry no code or data
                # HTTP/1.0 without Host (curl -0, old tools) is not a browser: served on loopback
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(b"GET /api/status HTTP/1.0\r\n\r\n")
                await writer.drain()
                head = (await asyncio.wait_for(reader.read(), 10)).split(b"\r\n", 1)[0]
                writer.close()
                assert head.endswith(b"200 OK"), head
        finally:
            await server.close()

    _run(go)


@pytest.mark.process
def test_browser_login_sets_a_strict_httponly_cookie_and_bearer_still_works(tmp_path: Path) -> None:
    agent = _agent(tmp_path)

    async def go() -> None:
        async with _serve(agent, token=TOKEN) as srv:
            jar = aiohttp.CookieJar(unsafe=True)  # cookies for an IP address
            async with aiohttp.ClientSession(timeout=TIMEOUT, cookie_jar=jar) as s:
                async with s.get(srv.url + "/", headers={"Accept": "text/html"}) as r:
                    page = await r.text()
                    assert r.status == 401 and '<form method="post" action="/login">' in page
                    assert "form-action 'self'" in r.headers["Content-Security-Policy"]
                async with s.get(srv.url + "/?token=wrong", allow_redirects=False) as r:
                    assert r.status == 401 and "Set-Cookie" not in r.headers
                async with s.get(srv.url + f"/?token={TOKEN}", allow_redirects=False) as r:
                    assert r.status == 303 and r.headers["Location"] == "/"
                    cookie = r.headers["Set-Cookie"]
                    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
                    assert TOKEN not in cookie and session_value(TOKEN) in cookie
                    assert f"rankwatch_session_{srv.port}=" in cookie
                async with s.get(srv.url + "/") as r:
                    assert r.status == 200 and "rank" in await r.text()
                async with s.get(srv.url + "/api/status") as r:
                    assert r.status == 200  # the page's links to the API work with the cookie
            async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
                async with s.post(srv.url + "/login", data={"token": "nope"}, allow_redirects=False) as r:
                    assert r.status == 401
                async with s.post(srv.url + "/login", data={"token": TOKEN}, allow_redirects=False) as r:
                    assert r.status == 303 and "SameSite=Strict" in r.headers["Set-Cookie"]
                async with s.get(srv.url + "/api/status", headers={"Authorization": f"Bearer {TOKEN}"}) as r:
                    assert r.status == 200
                forged = {"Cookie": f"rankwatch_session_{srv.port}={TOKEN}"}  # the token is not the cookie
                async with s.get(srv.url + "/api/status", headers=forged) as r:
                    assert r.status == 401
                other_port = {"Cookie": f"rankwatch_session_1={session_value('other')}"}
                async with s.get(srv.url + "/api/status", headers=other_port) as r:
                    assert r.status == 401

    _run(go)


@pytest.mark.process
def test_exposure_is_announced_once_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # an app without a token (make_app alone) on the network is said loudly
    assert exposure_warning(ServerConfig(), "0.0.0.0") is not None
    assert exposure_warning(ServerConfig(token="x"), "0.0.0.0") is None
    assert exposure_warning(ServerConfig(), "127.0.0.1") is None
    assert exposure_warning(ServerConfig(), "::1") is None
    agent = _agent(tmp_path)

    async def go() -> None:
        async with _serve(agent, listen="0.0.0.0:0"):
            pass
        async with _serve(agent, listen="0.0.0.0:0", token="t"):
            pass

    with caplog.at_level(logging.INFO, logger="rankwatch.server"):
        _run(go)
    # a started server always has a token: the made one is named (its file, never its value)
    assert not [r for r in caplog.records if "WITHOUT A TOKEN" in r.getMessage()]
    said = [r.getMessage() for r in caplog.records if "need the token in" in r.getMessage()]
    assert len(said) == 1 and "rankwatch url" in said[0]
    token = (Path(os.environ["XDG_RUNTIME_DIR"]) / "rankwatch" / "token").read_text().strip()
    assert all(token not in r.getMessage() for r in caplog.records)


# --- connections -----------------------------------------------------------------------------
async def _idle_connections(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        socks.append(s)
    await asyncio.sleep(0)
    return socks


async def _closed_by_server(sock: socket.socket, deadline: float) -> bool:
    loop = asyncio.get_running_loop()
    while time.monotonic() < deadline:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 4096), max(0.05, deadline - time.monotonic()))
        except (asyncio.TimeoutError, TimeoutError):
            return False
        except OSError:
            return True
        if data == b"":
            return True
    return False


@pytest.mark.process
def test_idle_and_half_sent_requests_time_out(tmp_path: Path) -> None:
    agent = _agent(tmp_path)

    async def go() -> None:
        async with _serve(agent, idle_timeout=0.5) as srv:
            loop = asyncio.get_running_loop()
            idle, partial, slow_body = (socket.socket() for _ in range(3))
            for s in (idle, partial, slow_body):
                s.setblocking(False)
                await loop.sock_connect(s, ("127.0.0.1", srv.port))
            started = time.monotonic()
            await loop.sock_sendall(partial, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            await loop.sock_sendall(
                slow_body,
                b"POST /api/status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            )
            for s in (idle, partial):
                assert await _closed_by_server(s, started + 5), "connection not closed"
            assert time.monotonic() - started < 4
            data = await asyncio.wait_for(loop.sock_recv(slow_body, 4096), 5)
            assert data.startswith(b"HTTP/1.1 408"), data[:40]
            for s in (idle, partial, slow_body):
                s.close()
            # keep-alive: an idle connection after a response is closed as well
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                async with session.get(srv.url + "/healthz") as r:
                    assert r.status == 200
                assert len(srv.guard or ()) == 1
                deadline = time.monotonic() + 5
                while srv.guard is not None and len(srv.guard) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert srv.guard is not None and len(srv.guard) == 0

    _run(go)


@pytest.mark.process
def test_connection_cap_evicts_idle_sockets_and_scrapes_get_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = _agent(tmp_path)

    async def go() -> None:
        async with _serve(agent, max_connections=16, idle_timeout=60) as srv:
            socks = await _idle_connections(srv.port, 200)
            try:
                async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
                    for path in ("/metrics", "/healthz", "/metrics"):
                        async with s.get(srv.url + path) as r:
                            assert r.status == 200, path
                    assert srv.guard is not None and len(srv.guard) <= 16
                    async with s.get(srv.url + "/metrics") as r:
                        text = await r.text()
                    m = re.search(DROPPED + r'\{[^}]*reason="idle_evicted"[^}]*\} (\S+)', text)
                    assert m and float(m.group(1)) >= 1, m  # the rest wait in the bounded accept queue
            finally:
                for s in socks:
                    s.close()

    with caplog.at_level(logging.DEBUG):
        _run(go)
    assert len([r for r in caplog.records if "max_connections" in r.getMessage()]) == 1
    assert not [r for r in caplog.records if r.exc_info]


# --- the real CLI against a descriptor limit (issue 16 item 4: 1,100 idle vs 1,024 fds) ----
def _get(url: str, timeout: float = 3.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def _answers(url: str, within: float) -> tuple[int, str]:
    deadline = time.monotonic() + within
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            return _get(url)
        except OSError as e:
            last = e
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {within}s: {last}")


@pytest.mark.process
@pytest.mark.parametrize(
    ("nofile", "lowered", "cap", "path"),
    [
        # the cap (at most a quarter of the descriptor limit) keeps the agent below its limit
        (256, None, 4096, "cap"),
        # the limit drops under a running agent: accept() fails, logged once, idle ones shed
        (4096, 96, 4096, "emfile"),
    ],
)
def test_idle_connection_flood_under_prlimit_keeps_metrics_and_healthz(
    tmp_path: Path, nofile: int, lowered: int | None, cap: int, path: str
) -> None:
    if not shutil.which("prlimit"):
        pytest.skip("prlimit (util-linux) not installed")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2000:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    idle = 600
    port = free_port()
    log = tmp_path / "rank-0.log"
    log.write_text("step=1 loss=2.0\n")
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        f"run: {{name: fd}}\nserver: {{listen: '127.0.0.1:{port}', max_connections: {cap}, "
        f"idle_timeout: {idle}s}}\ngpu: {{enabled: false}}\nlogs: {{format: kv}}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\nalerts: {{spool_dir: {tmp_path / 'spool'}}}\n"
    )
    err = tmp_path / "agent.err"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = ["prlimit", f"--nofile={nofile}", sys.executable, "-m", "rankwatch", "watch", "-c", str(cfg)]
    findings = tmp_path / "findings.jsonl"
    cmd += ["--log", str(log), "--findings-jsonl", str(findings)]
    with open(err, "wb") as fh:
        agent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, env=env)
    socks: list[socket.socket] = []
    try:
        _answers(f"http://127.0.0.1:{port}/healthz", 30)
        if lowered is not None:
            subprocess.run(["prlimit", "--pid", str(agent.pid), f"--nofile={lowered}:{lowered}"], check=True)
        for _ in range((lowered or nofile) + 300):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            socks.append(s)
        with open(log, "a") as fh:  # a NaN during the flood is still found and written
            fh.write("step=2 loss=nan\n")
        t0 = time.monotonic()
        status, _ = _answers(f"http://127.0.0.1:{port}/healthz", 30)
        assert status == 200
        status, text = _answers(f"http://127.0.0.1:{port}/metrics", 30)
        assert status == 200 and "rankwatch_build_info" in text
        took = time.monotonic() - t0
        assert took < 30
        want = ("idle_evicted",) if path == "cap" else ("accept_failed", "shed_on_emfile")
        deadline = time.monotonic() + 20  # the flood reaches the server as the accept queue drains
        while True:
            dropped = {
                k: float(v) for k, v in re.findall(DROPPED + r'\{[^}]*reason="(\w+)"[^}]*\} (\S+)', text)
            }
            if sum(dropped.get(k, 0.0) for k in want) > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
            status, text = _answers(f"http://127.0.0.1:{port}/metrics", 10)
            assert status == 200
        assert sum(dropped.get(k, 0.0) for k in want) > 0, dropped
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "nan_loss" not in (
            findings.read_text() if findings.exists() else ""
        ):
            time.sleep(0.2)
        assert "nan_loss" in findings.read_text(), (
            findings.read_text() if findings.exists() else "no findings file"
        )
        assert agent.poll() is None, "the agent died"
    finally:
        for s in socks:
            s.close()
        agent.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(15)
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    text = err.read_text(errors="replace")
    assert len(text) < 20_000, f"{len(text)} bytes of log:\n{text[-3000:]}"
    assert text.count("out of system resource") <= 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    if path == "emfile":
        assert text.count("cannot accept connections") == 1, text[-3000:]
