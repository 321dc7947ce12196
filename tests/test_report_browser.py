"""The incident report in a real browser: headless Chromium, driven over the DevTools protocol.

Each report of a real recording is opened from a ``file://`` URL at 1280 px and at a phone's
390 px: the verdict and the suspect's row are asserted in the DOM, the console must stay free
of errors (a CSP violation is one), no request may leave the page (it is self-contained), and
at 390 px nothing may widen the page past the screen (wide parts scroll inside their own box).
One report is also opened through the agent's ``/incidents/<id>`` route with the token. A
screenshot of each case lands in tmp_path, or in tests/data/report_screenshots with
``RANKWATCH_UPDATE_SCREENSHOTS=1`` (the ones kept there were reviewed by eye).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rankwatch.config.schema import Config, ServerConfig
from rankwatch.config.snapshot import replaced
from rankwatch.dumps.store import DumpStore
from rankwatch.identity import Identity
from rankwatch.report import build_report, render_html
from rankwatch.runtime.agent import Agent
from rankwatch.server import start_server

pytestmark = pytest.mark.tool

DATA = Path(__file__).parent / "data"
SHOTS = DATA / "report_screenshots"
WIDTHS = {"desktop": (1280, 900, False), "phone": (390, 844, True)}
MAX_SHOT_HEIGHT = 2400  # the verdict, the timeline, the rows and the start of the stacks


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium not installed (Debian: apt-get install -y chromium)")


class Browser:
    """One headless Chromium and one page, spoken to over the DevTools websocket."""

    def __init__(self, chrome: str, profile: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        cmd = [
            chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
            "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.profile = profile
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        self.session: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None

    async def open(self) -> None:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and self.proc.poll() is None, "Chromium did not start"
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        targets: list[dict[str, Any]] = []
        while not any(t.get("type") == "page" for t in targets):
            async with self.session.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = await self.session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self.call(f"{domain}.enable")

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self.ws is not None
        n = next(self.ids)
        await self.ws.send_json({"id": n, "method": method, "params": params})
        while True:
            msg = await asyncio.wait_for(self.ws.receive_json(), 30)
            if msg.get("id") == n:
                assert "error" not in msg, msg
                return dict(msg.get("result") or {})
            self.events.append(msg)

    async def wait_event(self, method: str) -> None:
        assert self.ws is not None
        while not any(e.get("method") == method for e in self.events):
            self.events.append(await asyncio.wait_for(self.ws.receive_json(), 30))

    async def load(self, url: str, width: int, height: int, mobile: bool) -> None:
        # A fresh document at the new size: a page kept from a wider emulation keeps its scale.
        self.events.clear()
        await self.call("Page.navigate", url="about:blank")
        await self.wait_event("Page.loadEventFired")
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )
        self.events.clear()
        await self.call("Page.navigate", url=url)
        await self.wait_event("Page.loadEventFired")

    async def js(self, expr: str) -> Any:
        got = await self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        assert "exceptionDetails" not in got, got
        return got["result"].get("value")

    async def screenshot(self, path: Path, width: int, mobile: bool) -> None:
        height = min(MAX_SHOT_HEIGHT, int(await self.js("document.documentElement.scrollHeight")))
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    def problems(self) -> tuple[list[str], list[str]]:
        """(console errors, requests) seen since the last load."""
        errors, requests = [], []
        for e in self.events:
            m, p = e.get("method"), e.get("params") or {}
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(json.dumps(p.get("args"))[:300])
            elif m == "Runtime.exceptionThrown":
                errors.append(json.dumps(p.get("exceptionDetails"))[:300])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(str(p["entry"].get("text"))[:300])
            elif m == "Network.requestWillBeSent":
                requests.append(str(p.get("request", {}).get("url")))
        return errors, requests

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


def _stacks_case(tmp: Path, case: str) -> Path:
    folder = tmp / "dumps" / "job1" / "20261125T135811Z_stall"
    shutil.copytree(DATA / "ddp_stacks" / case, folder)
    return tmp / "dumps"


def _real_case(tmp: Path, case: str) -> Path:
    shutil.copytree(DATA / "report_incidents" / case, tmp / case)
    return tmp / case / "dumps"


def _flight_case(tmp: Path, case: str) -> Path:
    folder = tmp / "dumps" / "job1" / "20261125T140000Z_stall"
    shutil.copytree(DATA / "flight_recorder" / case, folder)
    return tmp / "dumps"


# case name -> (how its dumps folder is made, the suspect rank, words of the verdict)
CASES: dict[str, tuple[Callable[[Path, str], Path], str, int, str]] = {
    "real_loader_hang": (_real_case, "loader_hang", 2, "the only rank not waiting in a collective"),
    "real_sigkill": (_real_case, "sigkill", 3, "rank 3 failed first: killed by signal 9 (SIGKILL)"),
    "real_barrier": (_real_case, "barrier", 0, "collective mismatch: rank 0 in barrier"),
    "loader_hang_native": (_stacks_case, "loader_hang_native", 2, "the only rank not waiting"),
    "flight_recorder_missing": (_flight_case, "missing", 1, "rank 1 never entered collective #5"),
}


def _render(tmp: Path, name: str) -> Path:
    make, case, _suspect, _words = CASES[name]
    root = make(tmp / name, case)
    store = DumpStore(root)
    (info,) = store.list_incidents()
    findings_file = root.parent / "findings.jsonl"
    findings = None
    if findings_file.exists():
        findings = [json.loads(x) for x in findings_file.read_text().splitlines() if x.strip()]
    rep = build_report(store, info, findings=findings, findings_source=str(findings_file))
    page = tmp / f"{name}.html"
    page.write_text(render_html(rep, link=lambda r: (info.path / f"rank-{r}.json").as_uri()))
    return page


def _shot_dir(tmp: Path) -> Path:
    if os.environ.get("RANKWATCH_UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(exist_ok=True)
        return SHOTS
    return tmp


def test_reports_render_in_chromium_at_desktop_and_phone_width(tmp_path: Path) -> None:
    chrome = _chromium()
    shots = _shot_dir(tmp_path)

    async def go() -> None:
        browser = Browser(chrome, tmp_path / "profile")
        try:
            await browser.open()
            for name, (_make, _case, suspect, words) in CASES.items():
                page = _render(tmp_path, name)
                url = page.as_uri()
                for label, (width, height, mobile) in WIDTHS.items():
                    await browser.load(url, width, height, mobile)
                    verdict = await browser.js("document.querySelector('#verdict').innerText")
                    assert f"Suspect: rank {suspect}" in verdict and words in verdict, (name, verdict)
                    first = await browser.js("document.querySelector('main').children[2].id")
                    assert first == "verdict", name  # the verdict comes first, after the title
                    row = await browser.js(
                        f"(() => {{ const r = document.querySelector('#ranks tr[data-rank=\"{suspect}\"]');"
                        " return r && [r.dataset.state, getComputedStyle(r.cells[0]).backgroundColor]; })()"
                    )
                    assert row is not None and row[0] == "suspect", (name, row)
                    assert row[1] != "rgba(0, 0, 0, 0)", row  # the suspect's row stands out
                    svg_row = await browser.js(
                        f"!!document.querySelector('svg.timeline g.row.suspect[data-ranks=\"{suspect}\"]')"
                    )
                    assert svg_row, name
                    overflow = await browser.js(
                        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
                    )
                    assert overflow <= 1, (name, label, overflow)  # wide parts scroll in their box
                    errors, requests = browser.problems()
                    assert not errors, (name, label, errors)
                    assert requests == [url], (name, label, requests)  # the page itself, nothing else
                    await browser.screenshot(shots / f"{name}-{label}.png", width, mobile)
                    assert (shots / f"{name}-{label}.png").stat().st_size > 5000
        finally:
            await browser.close()

    asyncio.run(asyncio.wait_for(go(), 240))


def test_the_status_page_route_serves_the_report_with_the_token(tmp_path: Path) -> None:
    chrome = _chromium()
    token = "rep0rt-t0ken-" + "y" * 20
    _real_case(tmp_path, "loader_hang")
    root = tmp_path / "loader_hang" / "dumps"
    (info,) = DumpStore(root).list_incidents()
    ident = Identity(run=info.run, rank=0, local_rank=0, world_size=4, node="n1")
    agent = Agent(replaced(Config(), {"dumps.dir": str(root)}), ident)

    async def go() -> None:
        server = await start_server(agent, ServerConfig(listen="127.0.0.1:0", token=token))
        browser = Browser(chrome, tmp_path / "profile")
        try:
            await browser.open()
            url = f"{server.url}/incidents/{info.name}?run={info.run}"
            await browser.load(url, 1280, 900, False)
            assert "needs its token" in await browser.js("document.body.innerText")  # the login form
            await browser.load(f"{server.url}/?token={token}", 1280, 900, False)  # session cookie
            await browser.load(url, 1280, 900, False)
            body = await browser.js("document.body.innerText")
            assert "Suspect: rank 2" in body, body[:2000]
            verdict = await browser.js("document.querySelector('#verdict').innerText")
            assert "Suspect: rank 2" in verdict
            errors, requests = browser.problems()
            assert not errors and requests == [url], (errors, requests)
            await browser.screenshot(_shot_dir(tmp_path) / "route_loader_hang-desktop.png", 1280, False)
            link = await browser.js(
                "document.querySelector('#ranks tr[data-rank=\"2\"] a').getAttribute('href')"
            )
            assert link == f"../api/dumps/{info.name}/2?format=text"
            await browser.load(f"{server.url}/incidents/{link}", 1280, 900, False)
            assert "read_shard_forever" in await browser.js("document.body.innerText")
        finally:
            await browser.close()
            await server.close()

    asyncio.run(asyncio.wait_for(go(), 120))
