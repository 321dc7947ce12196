"""The agent's HTTP server, served for real on loopback and driven with aiohttp."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from conftest import agent_token
from rankwatch.config.schema import Config, ServerConfig
from rankwatch.config.snapshot import replaced
from rankwatch.dumps.capture import DumpResult
from rankwatch.dumps.store import incident_name
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity, StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.server import Server, parse_listen, start_server
from rankwatch.server.protocol import MAX_HEADER_FIELD, MAX_HEADERS, HeadScanner

IDENT = Identity(run="t", rank=0, local_rank=0, world_size=2, node="n1")
TIMEOUT = aiohttp.ClientTimeout(total=10)


def _agent(tmp_path: Path, ranks: int = 2, logs: bool = True) -> Agent:
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, IDENT)
    now = time.time()
    for r in range(ranks):
        log = tmp_path / f"rank-{r}.log"
        if logs:
            log.touch()
        w = agent.add_watcher([log], dataclasses.replace(IDENT, rank=r, local_rank=r))
        w.streams[0].reader.fill()  # its log source's read (off the loop in the agent) opens it
        w._records(
            [
                StepRecord(step=i, total_steps=500, loss=2.0, tokens_per_s=9000.0, time=now - 50 + i / 4)
                for i in range(1, 201)
            ]
        )
    return agent


@contextlib.asynccontextmanager
async def _serve(agent: Agent, **cfg: Any) -> AsyncIterator[tuple[Server, aiohttp.ClientSession]]:
    server = await start_server(agent, ServerConfig(listen="127.0.0.1:0", **cfg))
    # without a configured token the agent made one in this test's runtime folder
    auth = {} if cfg.get("token") else {"Authorization": f"Bearer {agent_token()}"}
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT, headers=auth) as session:
            yield server, session
    finally:
        await server.close()


def _run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(fn(), 30))


def _dump(agent: Agent, ranks: tuple[int, ...] = (0, 1)) -> str:
    incident = incident_name("stall", datetime(2024, 5, 1, 10, 0, 0, tzinfo=timezone.utc))
    for r in ranks:
        result = DumpResult(
            pid=1000 + r,
            ok=True,
            threads=[{"pid": 1000 + r, "thread_name": "MainThread", "frames": []}],
            text=f"Thread 1000 (idle): MainThread\n    all_reduce (rank{r}.py:1)\n",
            error=None,
            duration_s=0.1,
            command=["py-spy", "dump"],
        )
        agent.store.write_rank("t", incident, r, result, {"run": "t", "last_step": 200})
    return incident


@pytest.mark.process
def test_every_route_answers(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    incident = _dump(agent)
    agent.emit(Finding("stall", Severity.CRITICAL, 1, "no progress for 901s", step=200, time=time.time()))

    async def go() -> None:
        async with _serve(agent) as (srv, s):
            assert srv.port > 0 and srv.url == f"http://127.0.0.1:{srv.port}"
            async with s.get(srv.url + "/healthz") as r:
                assert r.status == 200 and await r.text() == "ok\n"
            async with s.get(srv.url + "/readyz") as r:
                assert r.status == 200 and (await r.json())["ready"] is True
            async with s.get(srv.url + "/metrics") as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                fams = {f.name: f for f in text_string_to_metric_families(await r.text())}
                assert [x.value for x in fams["rankwatch_step"].samples] == [200, 200]
            async with s.get(srv.url + "/api/status") as r:
                assert r.status == 200
                doc = await r.json()
                assert [x["rank"] for x in doc["ranks"]] == [0, 1]
                r1 = doc["ranks"][1]
                assert r1["step"] == 200 and r1["total_steps"] == 500 and r1["node"] == "n1"
                assert r1["rates"]["tokens_per_s"] == 9000.0
                assert r1["rates"]["steps_per_s"] == pytest.approx(4.0)
                assert r1["last_progress"]["iso"].endswith("Z") and r1["last_progress"]["epoch"] > 0
                assert r1["stall_timeout_s"] > 0 and r1["seconds_since_progress"] >= 0
                assert [f["kind"] for f in r1["active_findings"]] == ["stall"]
                assert doc["ranks"][0]["active_findings"] == []
            async with s.get(srv.url + "/api/findings") as r:
                assert r.status == 200 and (await r.json())["findings"][0]["kind"] == "stall"
            async with s.get(srv.url + "/api/dumps") as r:
                doc = await r.json()
                assert [(i["incident"], i["ranks"]) for i in doc["incidents"]] == [(incident, [0, 1])]
            async with s.get(f"{srv.url}/api/dumps/{incident}/1") as r:
                assert r.status == 200
                doc = await r.json()
                assert doc["rank"] == 1 and doc["pid"] == 1001 and "rank1.py" in doc["text"]
            async with s.get(f"{srv.url}/api/dumps/{incident}/0?format=text") as r:
                assert r.status == 200 and r.content_type == "text/plain"
                text = await r.text()
                assert text.startswith("# rankwatch dump: rank 0, pid 1000") and "rank0.py" in text
            async with s.get(srv.url + "/") as r:
                assert r.status == 200 and r.content_type == "text/html"
                assert 'http-equiv="refresh"' in await r.text()

    _run(go)


@pytest.mark.process
def test_findings_newest_first_limited_and_active_only(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=1)
    for i in range(5):
        agent.emit(Finding("loss_spike", Severity.WARNING, 0, f"spike {i}", step=i))
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "no progress"))
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "progress resumed", resolved=True))

    async def go() -> None:
        async with _serve(agent) as (srv, s):
            async with s.get(srv.url + "/api/findings?limit=3") as r:
                doc = await r.json()
                assert [f["message"] for f in doc["findings"]] == [
                    "progress resumed",
                    "no progress",
                    "spike 4",
                ]
            async with s.get(srv.url + "/api/findings?active=1") as r:
                doc = await r.json()
                assert [(f["kind"], f["message"]) for f in doc["findings"]] == [("loss_spike", "spike 4")]
            async with s.get(srv.url + "/api/findings?kind=loss_spike&limit=2") as r:
                assert [f["step"] for f in (await r.json())["findings"]] == [4, 3]
            for bad in ("limit=0", "limit=1001", "limit=abc", "active=maybe", "kind=../x", "rank=-1"):
                async with s.get(f"{srv.url}/api/findings?{bad}") as r:
                    assert r.status == 400, bad

    _run(go)


@pytest.mark.process
def test_nan_loss_survives_into_json(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=1)
    agent.watchers[0]._records([StepRecord(step=201, loss=math.nan, time=time.time())])

    async def go() -> None:
        async with _serve(agent) as (srv, s), s.get(srv.url + "/api/status") as r:
            raw = await r.text()
            assert "NaN" in raw
            doc = await r.json()  # strict JSON: NaN is a string
            assert doc["ranks"][0]["loss"] == "NaN"
            assert doc["active_findings"][0]["kind"] == "nan_loss"

    _run(go)


@pytest.mark.process
def test_readyz_is_503_until_a_source_is_attached(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=2, logs=False)
    (tmp_path / "rank-0.log").touch()
    agent.watchers[0].streams[0].reader.fill()  # what the log source does each period, off the loop

    async def go() -> None:
        async with _serve(agent) as (srv, s):
            async with s.get(srv.url + "/readyz") as r:
                assert r.status == 503
                doc = await r.json()
                assert doc["ready"] is False and len(doc["detail"]) == 1
                assert "rank 1" in doc["detail"][0] and "rank-1.log" in doc["detail"][0]
            (tmp_path / "rank-1.log").touch()
            await asyncio.to_thread(agent.watchers[1].streams[0].reader.fill)
            async with s.get(srv.url + "/readyz") as r:
                assert r.status == 200

    _run(go)


@pytest.mark.process
def test_tokens_guard_api_page_and_metrics(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=1)

    async def go() -> None:
        async with _serve(agent, token="s3cret", metrics_token="m3trics") as (srv, s):
            good = {"Authorization": "Bearer s3cret"}
            for path in ("/api/status", "/api/findings", "/api/dumps", "/api/dumps/x/0", "/", "/api/nope"):
                async with s.get(srv.url + path) as r:
                    assert r.status == 401, path
                    assert r.headers["WWW-Authenticate"].startswith("Bearer")
                async with s.get(srv.url + path, headers={"Authorization": "Bearer wrong"}) as r:
                    assert r.status == 401, path
                    assert 'error="invalid_token"' in r.headers["WWW-Authenticate"]
            for path in ("/api/status", "/api/findings", "/api/dumps", "/"):
                async with s.get(srv.url + path, headers=good) as r:
                    assert r.status == 200, path
            async with s.get(srv.url + "/api/status", headers={"Authorization": "bearer s3cret"}) as r:
                assert r.status == 200
            async with s.get(srv.url + "/metrics", headers=good) as r:
                assert r.status == 401  # the API token is not the metrics token
            async with s.get(srv.url + "/metrics", headers={"Authorization": "Bearer m3trics"}) as r:
                assert r.status == 200 and "rankwatch_step" in await r.text()
            for sneaky in ("/%61pi/status", "/api/./status", "/%6Detrics"):  # decoded before the check
                async with s.get(URL(srv.url + sneaky, encoded=True)) as r:
                    assert r.status == 401, sneaky
            async with s.get(srv.url + "/healthz") as r:
                assert r.status == 200  # probes stay open
        async with _serve(agent, token="s3cret") as (srv, s), s.get(srv.url + "/metrics") as r:
            assert r.status == 200  # no metrics_token: open

    _run(go)


@pytest.mark.process
def test_dump_routes_reject_traversal_and_unknown_names(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=1)
    incident = _dump(agent, ranks=(0,))
    outside = tmp_path / "elsewhere" / "t" / incident  # a look-alike outside the store
    outside.mkdir(parents=True)
    (outside / "rank-0.json").write_text('{"rank": 0, "text": "SECRET"}')

    async def go() -> None:
        async with _serve(agent) as (srv, s):
            cases = {
                "/api/dumps/..%2F..%2Fetc/0": (400, 404),
                "/api/dumps/%2E%2E/0": (400, 404),
                "/api/dumps/..%2Felsewhere%2Ft%2F" + incident + "/0": (400, 404),
                f"/api/dumps/{quote(str(outside), safe='')}/0": (400, 404),
                "/api/dumps/x/abc": (400,),
                "/api/dumps/x/-1": (400,),
                f"/api/dumps/{incident}/1e3": (400,),
                f"/api/dumps/{incident}/7": (404,),
                "/api/dumps/20990101T000000Z_stall/0": (404,),
                f"/api/dumps/{incident}/0?format=html": (400,),
                "/api/dumps/../../etc/passwd": (404,),
            }
            for path, want in cases.items():
                async with s.get(URL(srv.url + path, encoded=True)) as r:
                    body = await r.text()
                    assert r.status in want, (path, r.status, body)
                    assert "SECRET" not in body and "root:" not in body
            prefix = incident[:10]  # a unique prefix is what DumpStore.find accepts
            async with s.get(f"{srv.url}/api/dumps/{prefix}/0") as r:
                assert r.status == 200 and (await r.json())["pid"] == 1000

    _run(go)


@pytest.mark.process
def test_method_size_and_route_errors(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=1)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(40):
            yield b"x" * 4096

    async def go() -> None:
        async with _serve(agent, max_request_bytes=64 << 10) as (srv, s):
            async with s.post(srv.url + "/api/status", data=b"x" * (200 << 10)) as r:
                assert r.status == 413
            async with s.post(srv.url + "/api/status", data=chunks()) as r:
                assert r.status == 413  # chunked, no Content-Length
            async with s.post(srv.url + "/api/status", data=b"{}") as r:
                assert r.status == 405
            async with s.delete(srv.url + "/metrics") as r:
                assert r.status == 405
            async with s.get(srv.url + "/nope") as r:
                assert r.status == 404
            async with s.get(srv.url + "/api/dumps/a/b/c") as r:
                assert r.status == 404
            async with s.head(srv.url + "/healthz") as r:
                assert r.status == 200

    _run(go)


async def _raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return (await asyncio.wait_for(reader.read(), 10)).split(b"\r\n")[0]
    finally:
        writer.close()


@pytest.mark.process
def test_oversized_request_line_and_headers_are_414_431_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """These arrive before authentication: a stranger must not fill the log with tracebacks."""
    agent = _agent(tmp_path, ranks=1)
    long_url = b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    long_header = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    many = b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"

    async def go() -> None:
        async with _serve(agent) as (srv, s):
            for _ in range(5):
                assert await _raw(srv.port, long_url) == b"HTTP/1.0 414 Request-URI Too Long"
            assert await _raw(srv.port, long_header) == b"HTTP/1.0 431 Request Header Fields Too Large"
            assert (await _raw(srv.port, many)).startswith(b"HTTP/1.0 431")
            assert (await _raw(srv.port, b"GET / HTTP/1.1\r\nBad Header\r\n\r\n")).startswith(b"HTTP/1.0 400")
            async with s.get(srv.url + "/healthz") as r:
                assert r.status == 200

    with caplog.at_level("DEBUG"):
        _run(go)
    assert not [r for r in caplog.records if "Error handling request" in r.getMessage()]
    assert [r.levelname for r in caplog.records if "malformed HTTP request" in r.getMessage()] == ["WARNING"]
    assert agent.http.rejected == {414: 5, 431: 2, 400: 1}


async def _raw_all(port: int, *parts: bytes) -> bytes:
    """Every byte the server sends until it closes; ``parts`` are written one drain apart."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


@pytest.mark.process
def test_414_and_431_come_from_the_bytes_pipelined_split_and_after_a_body(tmp_path: Path) -> None:
    """The status names the limit the raw bytes broke, wherever the line sits: after a good
    pipelined request, split across writes, or after a body longer than either limit."""
    agent = _agent(tmp_path, ranks=1)
    ok = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    long_url = b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    long_header = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    body = b"t" * 9000  # no line end: a scanner that read it as a line would say 414
    post = b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def go() -> None:
        async with _serve(agent) as (srv, _):
            got = await _raw_all(srv.port, ok + long_url)
            assert b" 414 " in got and b" 431 " not in got
            got = await _raw_all(srv.port, long_url[:3000], long_url[3000:6000], long_url[6000:])
            assert got.startswith(b"HTTP/1.0 414 ")
            got = await _raw_all(srv.port, post + long_header)
            assert b" 431 " in got and b" 414 " not in got
            got = await _raw_all(
                srv.port, b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 5000, b"a" * 5000 + b"\r\n\r\n"
            )
            assert got.startswith(b"HTTP/1.0 431 ")

    _run(go)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("stream", "verdict"),
    [
        (b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\n", 414),
        (b"\r\nGET /" + b"a" * 8200, 414),  # an empty line before the request line is allowed
        (b"GET / HTTP/1.1\r\nX: " + b"a" * 8200, 431),
        (b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * (MAX_HEADERS + 1), 431),
        (b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * MAX_HEADERS + b"\r\n", None),
        (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEADER_FIELD - 3) + b"\r\n\r\n", None),
        (b"GET / HTTP/1.1\r\n\r\nGET /" + b"a" * 8200, 414),
        (
            b"POST / HTTP/1.1\r\nContent-Length: 9000\r\n\r\n"
            + b"b" * 9000
            + b"GET / HTTP/1.1\r\nX: "
            + b"a" * 8200,
            431,
        ),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 9000, None),
    ],
)
def test_head_scanner_names_the_limit_broken(stream: bytes, verdict: int | None) -> None:
    whole, bytewise = HeadScanner(), HeadScanner()
    whole.feed(stream)
    for i in range(len(stream)):
        bytewise.feed(stream[i : i + 1])
    assert whole.verdict == bytewise.verdict == verdict


@pytest.mark.process
def test_handler_failure_is_500_json_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent = _agent(tmp_path, ranks=1)

    def boom() -> list:
        raise OSError("disk gone")

    agent.store.list_incidents = boom  # type: ignore[method-assign]

    async def go() -> None:
        async with _serve(agent) as (srv, s):
            for _ in range(3):
                async with s.get(srv.url + "/api/dumps") as r:
                    assert r.status == 500
                    assert (await r.json())["error"].startswith("internal error")
            async with s.get(srv.url + "/metrics") as r:
                text = await r.text()
            line = next(x for x in text.splitlines() if 'component="server"' in x)
            assert line.endswith(" 3.0")
            async with s.get(srv.url + "/healthz") as r:
                assert r.status == 200

    with caplog.at_level("ERROR", logger="rankwatch.server"):
        _run(go)
    assert sum("/api/dumps" in rec.getMessage() for rec in caplog.records) == 1


@pytest.mark.process
def test_status_page_lists_ranks_and_escapes_log_text(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=3)
    agent.emit(Finding("crash", Severity.CRITICAL, 2, "Traceback: <script>alert(1)</script>", step=200))

    async def go() -> None:
        async with _serve(agent) as (srv, s):
            async with s.get(srv.url + "/") as r:
                html = await r.text()
                assert r.headers["Content-Security-Policy"].startswith("default-src 'none'")
            assert html.count('<tr class="') + html.count("<tr><td") >= 3
            for rank in range(3):
                assert f'<td class="l">{rank}</td>' in html
            assert "<script>" not in html and "&lt;script&gt;" in html
            assert '<tr class="critical">' in html
            assert "200 / 500" in html

    _run(go)


@pytest.mark.unit
def test_listen_parsing() -> None:
    assert parse_listen("0.0.0.0:9478") == ("0.0.0.0", 9478)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen(":9478") == ("0.0.0.0", 9478)
    assert parse_listen("node-1.cluster:80") == ("node-1.cluster", 80)
    for bad in ("9478", "::1:9478", "[::1]9478", "host:port", "host:70000", "[::1"):
        with pytest.raises(ValueError):
            parse_listen(bad)


@pytest.mark.process
def test_ipv6_loopback_listen(tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"no IPv6 loopback here: {e}")
    agent = _agent(tmp_path, ranks=1)

    async def go() -> None:
        server = await start_server(agent, ServerConfig(listen="[::1]:0"))
        try:
            assert server.url == f"http://[::1]:{server.port}"
            async with aiohttp.ClientSession(timeout=TIMEOUT) as s, s.get(server.url + "/healthz") as r:
                assert r.status == 200
        finally:
            await server.close()

    _run(go)


@pytest.mark.process
def test_the_server_reads_only_the_snapshot_it_is_handed() -> None:
    """No agent at all: a callable returning snapshots is all the server and /metrics need."""
    from rankwatch.snapshot import AgentSnapshot, LoopView, RankSnapshot, SourcesView, TrainingView

    calls = []
    lag = LoopView(lag=7.5, healthy=False, health="event loop lagging: 7.5s")
    rank = RankSnapshot(
        labels=("t", "0", "0", "n1"),
        rank=0,
        own=True,
        local_rank=0,
        state=TrainingView(step_count=3, last_step=42, total_steps=100),
        sources=SourcesView(True, "rank 0: following 1 of 1 log file(s)"),
    )
    snap = AgentSnapshot(
        identity=IDENT, labels=("t", "0", "0", "n1"), time=time.time(), started_at=time.time() - 9,
        ranks=(rank,), sources=(rank.sources,), loop=lag,
    )  # fmt: skip

    def take() -> AgentSnapshot:
        calls.append(1)
        return snap

    async def go() -> None:
        server = await start_server(take, ServerConfig(listen="127.0.0.1:0"))
        auth = {"Authorization": f"Bearer {agent_token()}"}
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT, headers=auth) as s:
                async with s.get(server.url + "/healthz") as r:
                    assert r.status == 503 and "lagging" in await r.text()
                async with s.get(server.url + "/readyz") as r:
                    assert r.status == 200
                async with s.get(server.url + "/api/status") as r:
                    doc = await r.json()
                    assert doc["ranks"][0]["step"] == 42 and doc["ranks"][0]["progress_ratio"] == 0.42
                    assert 8 <= doc["uptime_s"] <= 10
                n = len(calls)
                async with s.get(server.url + "/") as r:
                    assert r.status == 200 and "42 / 100" in await r.text()
                assert len(calls) == n + 1  # the page and its extras come from one snapshot
                async with s.get(server.url + "/metrics") as r:
                    text = await r.text()
                assert 'rankwatch_step{local_rank="0",node="n1",rank="0",run="t"} 42.0' in text
                assert "rankwatch_event_loop_lag_seconds" in text
        finally:
            await server.close()

    _run(go)
