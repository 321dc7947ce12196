"""The Alertmanager sink against a real Alertmanager, which notifies a local webhook receiver.

Proves the v2 payload is accepted and routed (labels, firing, then resolved via endsAt),
which a fake server could not.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from conftest import free_port
from rankwatch.actions.alerts import AlertDispatcher
from rankwatch.config.schema import AlertmanagerConfig, AlertsConfig
from rankwatch.identity import Identity
from rankwatch.records import Diagnosis, Finding, Severity

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = [
    pytest.mark.tool,
    pytest.mark.skipif(
        BINARY is None,
        reason="needs Alertmanager: apt-get install prometheus-alertmanager (binary prometheus-alertmanager)",
    ),
]
WAIT_S = 30.0


AM_CONFIG = """
global:
  resolve_timeout: 5m
route:
  receiver: hook
  group_by: ['alertname', 'run', 'rank']
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: http://127.0.0.1:{port}/hook
        send_resolved: true
"""


async def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"alertmanager exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                async with s.get(url + "/-/ready") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    pytest.fail(f"alertmanager not ready within {WAIT_S}s: {log.read_text()[-2000:]}")


def test_alertmanager_receives_fires_and_resolves(tmp_path: Path) -> None:
    async def go() -> None:
        received: list[dict[str, Any]] = []
        arrived = asyncio.Event()

        async def hook(request: web.Request) -> web.Response:
            received.append(await request.json())
            arrived.set()
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        hook_port = runner.addresses[0][1]

        am_port = free_port()
        cfg_file = tmp_path / "alertmanager.yml"
        cfg_file.write_text(AM_CONFIG.format(port=hook_port))
        log = tmp_path / "alertmanager.log"
        assert BINARY is not None
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [
                    BINARY,
                    f"--config.file={cfg_file}",
                    f"--storage.path={tmp_path / 'data'}",
                    f"--web.listen-address=127.0.0.1:{am_port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        am_url = f"http://127.0.0.1:{am_port}"
        try:
            await wait_ready(am_url, proc, log)
            cfg = AlertsConfig(
                startup_quiet=0.0,
                group_wait=0.0,
                spool_dir=str(tmp_path / "spool"),
                alertmanager=AlertmanagerConfig(urls=[am_url], timeout=5.0),
            )
            ident = Identity(run="job42", rank=2, local_rank=2, world_size=8, node="gpu-node-7")
            d = AlertDispatcher(cfg, ident)
            task = asyncio.create_task(d.run())

            async def notification(status: str) -> dict[str, Any]:
                deadline = time.monotonic() + WAIT_S
                while True:
                    for n in received:
                        if n["status"] == status:
                            return n
                    left = deadline - time.monotonic()
                    assert left > 0, f"no {status} notification within {WAIT_S}s; got {received}"
                    arrived.clear()
                    try:
                        await asyncio.wait_for(arrived.wait(), left)
                    except asyncio.TimeoutError:
                        pass

            try:
                msg = (
                    "no progress for 12m; last step 1200; process alive, idle. Usual fix: look at the dumps."
                )
                d.send(
                    Finding(
                        "stall",
                        Severity.CRITICAL,
                        2,
                        msg,
                        step=1200,
                        diagnosis=Diagnosis(incident="/dumps/x"),
                    )
                )
                fired = await notification("firing")
                alert = fired["alerts"][0]
                assert alert["status"] == "firing"
                assert alert["labels"] == {
                    "alertname": "RankwatchStall",
                    "run": "job42",
                    "rank": "2",
                    "severity": "critical",
                    "kind": "stall",
                    "node": "gpu-node-7",
                }
                assert alert["annotations"]["description"] == msg
                assert alert["annotations"]["dump_path"] == "/dumps/x"
                assert d.stats["alertmanager"]["sent"] == 1

                d.send(Finding("stall", Severity.CRITICAL, 2, "progress resumed", step=1201, resolved=True))
                resolved = await notification("resolved")
                assert resolved["alerts"][0]["labels"]["alertname"] == "RankwatchStall"
                assert resolved["alerts"][0]["status"] == "resolved"
            finally:
                await d.close(2.0)
                await asyncio.wait_for(task, 5.0)
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            await runner.cleanup()

    asyncio.run(go())
