"""The status page at ``/``: rendering from a fake agent, and a real browser on a live agent."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import aiohttp
import pytest

from conftest import agent_token
from rankwatch.config.schema import Config, ServerConfig
from rankwatch.config.snapshot import replaced
from rankwatch.dumps.capture import DumpResult
from rankwatch.dumps.store import incident_name
from rankwatch.events import GpuSample
from rankwatch.identity import Identity
from rankwatch.records import Finding, Severity, StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.server import start_server
from rankwatch.server.page import PageExtras, load_page_extras, page_extras, render_page
from rankwatch.server.sparkline import sparkline
from rankwatch.server.status import status_doc

IDENT = Identity(run="r<1>", rank=0, local_rank=0, world_size=2, node='n1"><b>x</b>')
EVIL = "<script>alert(1)</script>"

# Every tag the page may contain: anything else in a rendered page came from unescaped input.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "strong", "table", "tr", "th",
    "td", "a", "br", "details", "summary", "pre", "svg", "polyline", "circle", "line",
}  # fmt: skip


# --- helpers -----------------------------------------------------------------------------
class _Page(HTMLParser):
    """Tags, hrefs and the rank rows (``data-rank``) of a page, with each row's text and links."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.hrefs: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.rows: dict[str, dict[str, Any]] = {}
        self._row: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.extend(attrs)
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"] or "")
            if self._row is not None:
                self._row["links"].append((a.get("class"), a["href"]))
        if tag == "tr":
            self._row = None
            if a.get("data-rank") is not None:
                self._row = {"state": a.get("data-state"), "text": "", "links": [], "svgs": 0}
                self.rows[a["data-rank"] or ""] = self._row
        if tag == "svg" and self._row is not None:
            self._row["svgs"] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None:
            self._row["text"] += data + " "


def _parse(html: str) -> _Page:
    p = _Page()
    p.feed(html)
    p.close()
    return p


def _agent(tmp_path: Path, ranks: int = 2) -> Agent:
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, IDENT)
    now = time.time()
    for r in range(ranks):
        log = tmp_path / f"rank-{r}.log"
        log.touch()
        w = agent.add_watcher([log], dataclasses.replace(IDENT, rank=r, local_rank=r))
        recs = [
            StepRecord(
                step=i,
                total_steps=500,
                loss=3.0 - i / 100 if not (r == 1 and i == 150) else math.nan,
                tokens_per_s=9000.0 + 10 * (i % 7),
                time=now - 50 + i / 4,
            )
            for i in range(1, 201)
        ]
        w._records(recs)
    return agent


def _dump(agent: Agent, ranks: tuple[int, ...] = (0, 1)) -> str:
    incident = incident_name("stall", datetime(2024, 5, 1, 10, 0, 0, tzinfo=timezone.utc))
    for r in ranks:
        result = DumpResult(
            pid=1000 + r,
            ok=True,
            threads=[],
            text=f"Thread 1 (idle): MainThread\n    wait_for_batch (<evil>{r}.py:1)\n",
            error=None,
            duration_s=0.1,
            command=["py-spy", "dump"],
        )
        agent.store.write_rank(agent.identity.run, incident, r, result, {"last_step": 200})
    return incident


def _render(agent: Agent, extras: PageExtras | None) -> str:
    return render_page(status_doc(agent.snapshot()), extras)


def _evil_finding(agent: Agent) -> None:
    agent.emit(
        Finding(
            "crash",
            Severity.CRITICAL,
            1,
            f"Traceback (most recent call last): {EVIL} & more",
            step=200,
            line=77,
            path='/logs/"><img src=x onerror=alert(2)>.log',
            time=time.time(),
            evidence={
                "traceback": ["Traceback:", f"  File </pre>{EVIL}", "RuntimeError: <b>boom</b>"],
                "exit_code": 1,
                "loss": math.nan,
                "grads": [1.0, math.inf, 2.5],
                "details": {"<k>": "<v>"},
            },
        )
    )


# --- rendering with a fake agent ---------------------------------------------------------
@pytest.mark.unit
def test_log_derived_text_is_escaped_everywhere(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    _dump(agent)
    _evil_finding(agent)
    incidents = [
        {"run": "r_1_", "incident": "20240501T100000Z_stall", "reason": "stall",
         "time": "2024-05-01T10:00:00Z", "ranks": [0, 1]},
    ]  # fmt: skip
    html = _render(agent, page_extras(agent.snapshot(), incidents))
    page = _parse(html)
    assert page.tags <= ALLOWED_TAGS, page.tags - ALLOWED_TAGS
    low = html.lower()
    assert "<script" not in low and "<img" not in low and "<b>" not in low
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown, as text
    assert "&lt;/pre&gt;" in html and "&lt;b&gt;boom&lt;/b&gt;" in html  # evidence lines, as text
    assert "&lt;img src=x" in html and "&lt;k&gt;" in html
    assert all(not (v or "").lower().startswith("javascript:") for _, v in page.attrs)
    assert all(h.startswith(("api/", "metrics", "incidents/")) for h in page.hrefs), page.hrefs
    # The node name and run (environment) are escaped in the title and the rank rows.
    assert "<title>rankwatch: r&lt;1&gt; on n1&quot;&gt;&lt;b&gt;x&lt;/b&gt;</title>" in html


TERMINAL = "CUDA error \x1bc\x1b(0\x1b#8\x1b]52;c;cm0gLXJm\x07\x9b2J \u202eatad/\u202c \u2066i\u2069 \x85x"
_RAW = set(map(chr, [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]))
_RAW |= set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")


@pytest.mark.unit
def test_escape_sequences_and_bidi_overrides_are_shown_not_sent(tmp_path: Path) -> None:
    """A hostile log line in a finding's message and evidence, in the run and node names and
    in a dump's text: the page shows each escape (a copy pasted into a terminal does nothing)."""
    ident = dataclasses.replace(IDENT, run="r\x1b]0;t\x07", node="n\u202e1")
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, ident)
    log = tmp_path / "rank-0.log"
    log.touch()
    agent.add_watcher([log], ident)
    agent.emit(
        Finding(
            "crash",
            Severity.CRITICAL,
            0,
            f"exited: {TERMINAL}",
            step=3,
            evidence={"traceback": ["Traceback:", TERMINAL, f"RuntimeError: {TERMINAL}"], "k\x1b": TERMINAL},
        )
    )
    html = _render(agent, None)
    assert [c for c in html if c in _RAW] == []
    assert "\u241b]52;c;cm0gLXJm\u2407" in html and "\u241bc\u241b(0\u241b#8" in html
    assert "\\u202eatad/" in html and "\\x9b2J" in html and "exited: CUDA error" in html


@pytest.mark.unit
def test_ranks_have_sparklines_evidence_and_dump_links(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    incident = _dump(agent)
    _evil_finding(agent)
    extras = asyncio.run(load_page_extras(agent.snapshot()))
    assert extras.incidents is not None and [i["incident"] for i in extras.incidents] == [incident]
    html = _render(agent, extras)
    page = _parse(html)
    assert set(page.rows) == {"0", "1"}
    for rank, row in page.rows.items():
        assert row["state"] == "running"
        assert row["svgs"] == 2, rank  # loss and throughput
        assert "200 / 500" in row["text"] and "tokens/s" in row["text"]
        assert ("dump", f"api/dumps/{incident}/{rank}?format=text") in row["links"]
    # Rank 1 printed a NaN loss at step 150: the sparkline marks it rather than dropping it.
    assert html.count('class="nonfinite"') == 1
    assert "crash" in page.rows["1"]["text"] and "crash" not in page.rows["0"]["text"]
    # The finding's evidence is on the page, open because it is critical.
    assert "<details open><summary>evidence</summary><pre>" in html
    assert "exit_code: 1" in html and "loss: nan" in html and "grads: [1, inf, 2.5]" in html
    assert '/logs/"&gt;&lt;img src=x onerror=alert(2)&gt;.log:77' in html.replace("&quot;", '"')
    # The incident table links every rank's stack.
    assert f'href="api/dumps/{incident}/0?format=text">rank 0</a>' in html
    # ... and names the incident's report page (the same renderer as `rankwatch report`).
    assert f'class="report" href="incidents/{incident}?run=' in html


@pytest.mark.unit
def test_stalled_rank_is_flagged_and_doc_alone_still_renders(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    doc = status_doc(agent.snapshot())
    doc["ranks"][1]["stalled"] = True
    page = _parse(html := render_page(doc))  # no extras: what an older server hands over
    assert page.rows["1"]["state"] == "stalled" and "STALLED" in page.rows["1"]["text"]
    assert page.rows["0"]["state"] == "running" and "STALLED" not in page.rows["0"]["text"]
    assert "STALLED: rank 1" in html
    assert page.rows["0"]["svgs"] == 0 and "9.04k tokens/s" in page.rows["0"]["text"]
    assert "GPU" not in html  # no GPU source: no GPU column, no GPU section
    assert page.tags <= ALLOWED_TAGS


@pytest.mark.unit
def test_gpu_summary_when_the_hook_is_wired(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    now = time.time()
    healthy = GpuSample(
        index=0, time=now, name="NVIDIA <H100>", utilization=0.97, memory_used=61 << 30,
        memory_total=80 << 30, temperature=71.0, power=650.0, power_limit=700.0,
        throttle={"gpu_idle": False, "sw_power_cap": True}, xid_counts={79: 1},
    )  # fmt: skip
    lost = GpuSample(index=1, time=now, lost=True, lost_reason="fell off the bus <x>")
    agent.gpu_latest = lambda: ({0: [healthy], "": [lost]}, True)
    html = _render(agent, page_extras(agent.snapshot()))
    page = _parse(html)
    assert "GPU0 97% 61.0/80 GiB 71°C" in page.rows["0"]["text"]
    assert "<h2>GPUs</h2>" in html and "NVIDIA &lt;H100&gt;" in html
    assert "LOST: fell off the bus &lt;x&gt;" in html
    assert "sw_power_cap" in html and "79×1" in html and "650 / 700 W" in html
    assert page.tags <= ALLOWED_TAGS

    def broken() -> Any:
        raise RuntimeError("NVML went away")

    agent.gpu_latest = broken
    html = _render(agent, page_extras(agent.snapshot()))
    assert "GPU data unavailable: RuntimeError" in html and set(_parse(html).rows) == {"0", "1"}
    agent.gpu_latest = lambda: ({}, False)
    assert "GPU sampler down" in _render(agent, page_extras(agent.snapshot()))


@pytest.mark.unit
def test_page_degrades_when_the_dump_store_cannot_be_listed(tmp_path: Path) -> None:
    agent = _agent(tmp_path)

    def boom() -> list:
        raise OSError("disk gone")

    agent.store.list_incidents = boom  # type: ignore[method-assign]
    extras = asyncio.run(load_page_extras(agent.snapshot()))
    assert extras.incidents is None and extras.incidents_error == "cannot list the dump store (OSError)"
    html = _render(agent, extras)
    assert "cannot list the dump store (OSError)" in html and set(_parse(html).rows) == {"0", "1"}


@pytest.mark.unit
def test_sparkline_shapes() -> None:
    assert sparkline([]) == "" and sparkline([None, None]) == ""
    svg = sparkline([1.0, 2.0, None, 3.0, math.nan, 2.0, 1.0], title="loss <x>")
    assert svg.startswith('<svg class="spark"') and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2 and svg.count('class="nonfinite"') == 1
    assert "<title>loss &lt;x&gt;: min 1, max 3, last 1, 1 non-finite</title>" in svg
    coords = [float(x) for x in re.findall(r"(-?\d+\.\d+)", svg)]
    assert all(0.0 <= c <= 120.0 for c in coords)
    flat = sparkline([5.0] * 10)
    assert "min 5, max 5" in flat and "<polyline" in flat
    assert "<circle" in sparkline([7.0])  # one point is still drawn
    only_nan = sparkline([math.nan, math.nan])
    assert only_nan.count('class="nonfinite"') == 2 and "2 non-finite value(s)" in only_nan


@pytest.mark.process
def test_token_guards_the_page_and_never_reaches_the_html(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    incident = _dump(agent)
    token = "s3cret-t0ken-value"

    async def go() -> None:
        server = await start_server(agent, ServerConfig(listen="127.0.0.1:0", token=token))
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
                async with s.get(server.url + "/") as r:
                    assert r.status == 401 and token not in await r.text()
                auth = {"Authorization": f"Bearer {token}"}
                async with s.get(server.url + "/", headers=auth) as r:
                    assert r.status == 200
                    html = await r.text()
                    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
                assert token not in html and "Bearer" not in html
                href = f"api/dumps/{incident}/1?format=text"
                assert f'href="{href}"' in html
                # The link is under the same token rule as the page.
                async with s.get(urljoin(server.url + "/", href)) as r:
                    assert r.status == 401
                async with s.get(urljoin(server.url + "/", href), headers=auth) as r:
                    assert r.status == 200 and "wait_for_batch" in await r.text()
        finally:
            await server.close()

    asyncio.run(asyncio.wait_for(go(), 30))


# --- a real browser on a live agent ------------------------------------------------------
def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium not installed (Debian: apt-get install -y chromium)")


def _browse(chrome: str, tmp_path: Path, url: str, *args: str) -> str:
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    profile.mkdir()
    cmd = [
        chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", *args, url,
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _png_is_nontrivial(path: Path, width: int, height: int) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, len(data)
    assert data[12:16] == b"IHDR"
    assert int.from_bytes(data[16:20], "big") == width and int.from_bytes(data[20:24], "big") == height
    idat, pos = b"", 8
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        if data[pos + 4 : pos + 8] == b"IDAT":
            idat += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    pixels = zlib.decompress(idat)
    assert len(set(pixels)) > 16  # not a blank (single-colour) page


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _get_json(url: str, token: str | None = None) -> Any:
    import json

    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


@pytest.mark.tool
def test_browser_shows_the_stalled_rank_and_opens_its_stack(tmp_path: Path) -> None:
    chrome = _chromium()
    logs = tmp_path / "logs"
    logs.mkdir()
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        "run: {name: pagetest}\ndetectors: {warmup_steps: 5}\n"
        "stall: {startup_grace: 20s, floor: 2s, factor: 10}\nprocess: {sample_interval: 200ms}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\nserver: {{listen: '127.0.0.1:0'}}\ngpu: {{enabled: false}}\n"
    )
    procs: list[subprocess.Popen] = []
    try:
        for r in range(2):  # independent ranks (no --sync-dir): rank 0 keeps training while 1 hangs
            with open(logs / f"rank-{r}.log", "ab") as fh:
                cmd = [
                    sys.executable, "-m", "rankwatch.demo.trainer", "--rank", str(r), "--world-size", "2",
                    "--steps", "100000", "--step-time", "0.05", "--format", "megatron", "--all-ranks-log",
                    "--fault", "hang@60:rank=1",
                ]  # fmt: skip
                env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", PYTHONUNBUFFERED="1")
                procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env))
        err_path = tmp_path / "agent.err"
        with open(err_path, "wb") as err:
            agent_cmd = [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg)]
            for p in procs:
                agent_cmd += ["--pid", str(p.pid)]
            for r in range(2):
                agent_cmd += ["--log", str(logs / f"rank-{r}.log")]
            agent = subprocess.Popen(agent_cmd, stdout=subprocess.DEVNULL, stderr=err)
        procs.append(agent)
        pattern = re.compile(r"serving metrics and API on [^\s]+:(\d+)")
        port = _wait(lambda: pattern.search(err_path.read_text(errors="replace")), 20, "the agent's port")
        base = f"http://127.0.0.1:{port.group(1)}/"
        # no server.token: the agent made one in this user's runtime folder, as `rankwatch url` reads
        token = agent_token()

        def stalled_with_dump() -> bool:
            st = _get_json(base + "api/status", token)
            dumps = _get_json(base + "api/dumps", token)
            if not st or not dumps:
                return False
            by_rank = {x["rank"]: x for x in st["ranks"]}
            return (
                by_rank.get(1, {}).get("stalled") is True
                and by_rank.get(0, {}).get("stalled") is False
                and any(1 in i["ranks"] for i in dumps["incidents"])
            )

        _wait(stalled_with_dump, 45, "rank 1 stalled with a stack dump")

        shot = tmp_path / "page.png"
        size = "--window-size=1400,1000"
        signed_in = f"{base}?token={token}"  # the link `rankwatch url` prints: 303 to / with a cookie
        _browse(chrome, tmp_path, signed_in, f"--screenshot={shot}", size, "--hide-scrollbars")
        _png_is_nontrivial(shot, 1400, 1000)
        assert "rankwatch: sign in" not in _browse(chrome, tmp_path, signed_in, "--dump-dom")

        page = _parse(_browse(chrome, tmp_path, signed_in, "--dump-dom"))
        assert set(page.rows) == {"0", "1"}, page.rows
        assert page.rows["1"]["state"] == "stalled" and "STALLED" in page.rows["1"]["text"]
        assert page.rows["0"]["state"] == "running" and "STALLED" not in page.rows["0"]["text"]
        assert page.rows["0"]["svgs"] == 2  # loss and throughput (steps/s: Megatron prints step times)
        assert "stall" in page.rows["1"]["text"]
        dump_links = [href for cls, href in page.rows["1"]["links"] if cls == "dump"]
        assert len(dump_links) == 1 and dump_links[0].startswith("api/dumps/"), page.rows["1"]["links"]

        # each _browse is a fresh profile (no cookie): the stack link is opened with the token
        link = urljoin(base, dump_links[0])
        req = urllib.request.Request(link, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            stack = r.read().decode()
        with contextlib.suppress(urllib.error.HTTPError), urllib.request.urlopen(link):
            raise AssertionError("a stack was served without the token")
        assert "rankwatch dump: rank 1" in stack and "wait_for_batch" in stack, stack[:3000]
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.mark.tool
def test_browser_opens_the_page_with_the_token_and_not_without(tmp_path: Path) -> None:
    """Issue 20: with server.token set, a browser opens / with ?token= (a session cookie, then a
    redirect that drops the token from the address); without it, it gets the login form."""
    chrome = _chromium()
    token = "br0wser-t0ken-" + "x" * 20
    log = tmp_path / "rank-0.log"
    log.write_text("".join(f"step={i} loss={2.0 - i / 100:.3f}\n" for i in range(1, 40)))
    cfg = tmp_path / "rw.yaml"
    cfg.write_text(
        "run: {name: tokentest, rank: 0}\nlogs: {format: kv}\ngpu: {enabled: false}\n"
        f"dumps: {{dir: {tmp_path / 'dumps'}}}\nalerts: {{spool_dir: {tmp_path / 'spool'}}}\n"
        "server: {listen: '127.0.0.1:0', token: '${RANKWATCH_TOKEN}'}\n"
    )
    err_path = tmp_path / "agent.err"
    env = dict(os.environ, RANKWATCH_TOKEN=token, PYTHONUNBUFFERED="1")
    with open(err_path, "wb") as err:
        agent = subprocess.Popen(
            [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg), "--log", str(log)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
        )
    try:
        pattern = re.compile(r"serving metrics and API on [^\s]+:(\d+)")
        port = _wait(lambda: pattern.search(err_path.read_text(errors="replace")), 20, "the agent's port")
        base = f"http://127.0.0.1:{port.group(1)}/"

        without = _browse(chrome, tmp_path, base, "--dump-dom")
        page = _parse(without)
        assert page.rows == {}, page.rows
        assert 'action="/login"' in without and "needs its token" in without

        wrong = _browse(chrome, tmp_path, base + "?token=nope", "--dump-dom")
        assert _parse(wrong).rows == {} and "Wrong token" in wrong

        with_token = _browse(chrome, tmp_path, base + f"?token={token}", "--dump-dom")
        page = _parse(with_token)
        assert set(page.rows) == {"0"}, with_token[:2000]
        assert token not in with_token

        # scripts keep using the header
        req = urllib.request.Request(base + "api/status", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200
        assert token not in err_path.read_text(errors="replace")
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(timeout=5)


@pytest.mark.unit
def test_throughput_falls_back_to_the_steps_per_s_the_agent_knows(tmp_path: Path) -> None:
    """A log with neither tokens/s nor a step time (HF's loss lines): the agent still knows
    steps/s from the step timestamps, and the page shows it instead of "–"."""
    agent = Agent(replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")}), IDENT)
    log = tmp_path / "rank-0.log"
    log.touch()
    w = agent.add_watcher([log], IDENT)
    now = time.time()
    w._records([StepRecord(step=i, loss=2.0, time=now - 50 + i / 2) for i in range(1, 60)])
    doc = status_doc(agent.snapshot())
    steps_per_s = doc["ranks"][0]["rates"]["steps_per_s"]
    assert steps_per_s is not None and doc["ranks"][0]["rates"]["tokens_per_s"] is None
    for extras in (None, page_extras(agent.snapshot())):
        row = _parse(render_page(doc, extras)).rows["0"]["text"]
        assert "steps/s" in row, row
