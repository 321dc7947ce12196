"""The wired live agent: a real child under run mode, the HTTP server, an alert webhook,
GPU metrics from the fake NVML backend, and the checkpoint watcher, all at once."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gpufake import FakeBackend, healthy
from rankwatch.config.loader import load_config
from rankwatch.config.snapshot import replaced
from rankwatch.detectors.liveness import StallDetector
from rankwatch.identity import Identity
from rankwatch.runtime.modes import run_command
from rankwatch.runtime.services import Services

TRAINER = [sys.executable, "-m", "rankwatch.demo.trainer", "--rank", "0", "--step-time", "0.02"]
IDENT = Identity(run="svc", rank=0, local_rank=0, world_size=1, node="n1")


def _plain_checkpoint(path: Path) -> None:
    """A torch.save-style zip with the entries torch writes (no torch needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/version", b"3\n")
        z.writestr("archive/data/0", b"\0" * 4096)


def _config(tmp: Path, hook: str) -> Path:
    cfg = tmp / "rw.yaml"
    cfg.write_text(
        f"""\
run: {{name: svc}}
detectors: {{warmup_steps: 5}}
process: {{sample_interval: 200ms}}
dumps: {{dir: {tmp / "dumps"}}}
runner: {{log_dir: {tmp / "logs"}, echo: false, term_grace: 3s}}
server: {{listen: "127.0.0.1:0", token: sekrit}}
gpu: {{interval: 200ms}}
checkpoints: {{dir: {tmp / "ckpt"}, settle: 0s, poll_interval: 200ms, mode: poll}}
alerts:
  startup_quiet: 0s
  group_wait: 0s
  spool_dir: {tmp / "spool"}
  webhook: {{urls: ["{hook}"]}}
"""
    )
    return cfg


async def _until(pred, timeout: float = 30.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await pred():
            return True
        await asyncio.sleep(0.1)
    return False


@pytest.mark.tool
def test_run_mode_serves_metrics_alerts_gpu_and_checkpoints(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'); CI installs it")
    _plain_checkpoint(tmp_path / "ckpt" / "step_10.pt")

    async def main() -> None:
        received: list[dict] = []

        async def hook(request: web.Request) -> web.Response:
            received.append(await request.json())
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/hook", hook)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        cfg = load_config(_config(tmp_path, f"http://127.0.0.1:{port}/hook"))
        started: list[Services] = []
        backend = FakeBackend([healthy(0)])
        cmd = [*TRAINER, "--steps", "400", "--fault", "nan@100", "--format", "nanogpt"]
        task = asyncio.create_task(
            run_command(
                cfg, IDENT, cmd, sinks=[], services={"gpu_backend": backend, "on_start": started.append}
            )
        )
        try:
            assert await _until(lambda: _true(bool(started)), 20)
            svc = started[0]
            assert svc.server is not None and svc.source("gpu") is not None and svc.checkpoints is not None
            base = svc.server.url

            async def nan_alerted() -> bool:
                return any(r.get("kind") == "nan_loss" for r in received)

            assert await _until(nan_alerted), received
            async with aiohttp.ClientSession() as http:

                async def scrape() -> str:
                    async with http.get(base + "/metrics") as r:
                        assert r.status == 200
                        return await r.text()

                async def complete() -> bool:
                    text = await scrape()
                    return all(
                        m in text
                        for m in (
                            "rankwatch_gpu_utilization_ratio{",
                            "rankwatch_checkpoint_last_good_step{",
                            "rankwatch_alerts_sent_total{",
                        )
                    )

                assert await _until(complete), await scrape()
                text = await scrape()
                assert 'rankwatch_gpu_collector_up{node="n1",rank="0",run="svc"} 1.0' in text
                assert (
                    'rankwatch_checkpoint_last_good_step{local_rank="0",node="n1",rank="0",run="svc"} 10.0'
                    in text
                )
                assert 'kind="nan_loss"' in text
                assert "rankwatch_step{" in text
                # The whole exposition a live agent serves (agent, GPU, checkpoint, alert and
                # config families together) passes promtool, not just each collector alone.
                res = subprocess.run(
                    [promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
                )
                assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), res
                async with http.get(base + "/api/status") as r:
                    assert r.status == 401
                async with http.get(base + "/api/status", headers={"Authorization": "Bearer sekrit"}) as r:
                    doc = await r.json()
                assert doc["run"] == "svc" and any(f["kind"] == "nan_loss" for f in doc["active_findings"])
        finally:
            rc = await asyncio.wait_for(task, 60)
            await runner.cleanup()
        assert rc == 0
        alert = next(r for r in received if r["kind"] == "nan_loss")
        assert (alert["run"], alert["rank"], alert["severity"], alert["step"]) == ("svc", 0, "critical", 100)
        assert "Last good checkpoint to resume from: " in alert["message"]
        assert alert["message"].endswith("step_10.pt (step 10).")
        assert alert["evidence"]["last_good_step"] == 10
        assert backend.calls["memory"] > 0

    asyncio.run(main())


async def _true(v: bool) -> bool:
    return v


@pytest.mark.process
def test_services_degrade_without_nvml_and_with_port_taken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NVML absent: one log line, no GPU series. Port taken: one error, counted; the rank runs on."""

    async def main() -> None:
        blocker = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = blocker.sockets[0].getsockname()[1]
        cfg_path = tmp_path / "rw.yaml"
        cfg_path.write_text(
            f"run: {{name: deg}}\nrunner: {{log_dir: {tmp_path / 'logs'}, echo: false}}\n"
            f"server: {{listen: '127.0.0.1:{port}'}}\ndumps: {{dir: {tmp_path / 'd'}}}\n"
        )
        cfg = load_config(cfg_path)
        started: list[Services] = []
        cmd = [*TRAINER, "--steps", "20", "--format", "nanogpt"]
        try:
            rc = await asyncio.wait_for(
                run_command(cfg, IDENT, cmd, sinks=[], services={"on_start": started.append}), 60
            )
        finally:
            blocker.close()
        assert rc == 0
        svc = started[0]
        assert svc.server is None and svc.agent.internal_errors_by_component.get("server") == 1
        gpu = svc.source("gpu")
        if gpu is None or not gpu.sampler.available:  # no NVML on this machine (the usual case in CI)
            gpu_lines = [r for r in caplog.records if "NVML" in r.getMessage() or "GPU" in r.getMessage()]
            assert len(gpu_lines) == 1, [r.getMessage() for r in gpu_lines]

    with caplog.at_level(logging.INFO, logger="rankwatch"):
        asyncio.run(main())


@pytest.mark.process
def test_eta_past_slurm_time_limit_is_warned(tmp_path: Path) -> None:
    """A run that needs days more inside a job ending in an hour, with no checkpoint due."""
    import dataclasses
    import time

    async def main() -> None:
        cfg_path = tmp_path / "rw.yaml"
        cfg_path.write_text(
            f"runner: {{log_dir: {tmp_path / 'logs'}, echo: false}}\ngpu: {{enabled: false}}\n"
            f"server: {{listen: '127.0.0.1:0'}}\ndumps: {{dir: {tmp_path / 'd'}}}\n"
        )
        cfg = load_config(cfg_path)
        ident = dataclasses.replace(IDENT, job_end=time.time() + 3600)
        started: list[Services] = []
        cmd = [*TRAINER, "--steps", "150", "--total-steps", "1000000", "--format", "megatron"]
        task = asyncio.create_task(
            run_command(cfg, ident, cmd, sinks=[], services={"on_start": started.append})
        )
        try:
            assert await _until(lambda: _true(bool(started)), 20)
            svc = started[0]
            w = svc.agent.watchers[0]
            assert await _until(lambda: _true((w.engine.state.last_step or 0) >= 60), 30)
            for _ in range(3):
                await svc.poll("deadline")  # the job's clock, as every 30 s
            warned = [f for f in svc.agent.findings if f.kind == "eta_past_job_end"]
            assert len(warned) == 1 and "job ends in 59m" in warned[0].message
            async with aiohttp.ClientSession() as http, http.get(svc.server.url + "/metrics") as r:
                text = await r.text()
            assert "rankwatch_job_end_timestamp_seconds{" in text
            assert "rankwatch_eta_seconds{" in text
        finally:
            assert await asyncio.wait_for(task, 60) == 0

    asyncio.run(main())


@pytest.mark.unit
def test_a_runs_first_save_ends_the_checkpoint_allowance(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Saves already on disk when the agent starts are history; the first save of the run is
    seen being written, then finished (which ends the allowance), like every later one."""
    from rankwatch.checkpoints.watcher import CheckpointWatcher
    from rankwatch.config.schema import Config
    from rankwatch.runtime.agent import Agent
    from rankwatch.runtime.services import Services
    from rankwatch.sources.polled import SourceContext
    from rankwatch.sources.polled.checkpoints import CheckpointActivity

    class FakeCheckpoints:
        scans, writing, saved, polls = 0, False, None, 0

        def snapshot(self) -> dict:
            self.polls += 1
            return {"last_checkpoint_timestamp_seconds": self.saved}

        def write_age(self) -> float | None:
            return 0.0 if self.writing else None  # written to just now

    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, IDENT)
    w = agent.add_watcher([])
    seen: list[str] = []
    stall = w.engine.detector(StallDetector)
    monkeypatch.setattr(stall, "on_activity", lambda now, what: seen.append(what))
    svc = Services(agent, cfg)
    cw = FakeCheckpoints()
    svc.checkpoints = cw  # type: ignore[assignment]

    status = lambda: CheckpointWatcher.status(cw)  # noqa: E731 - the watcher's own reading, of the fake
    source = CheckpointActivity.create(SourceContext(cfg, dict, checkpoints=status))
    assert source is not None
    svc.add_source(source)

    async def main() -> None:
        async def settle() -> None:
            """One poll of the checkpoint activity source (every second in the agent): it reads
            the snapshot and hands the status to every rank's engine."""
            polls = cw.polls
            assert await svc.poll(source.name) is not None
            assert cw.polls == polls + 1

        await settle()
        cw.scans = 1  # the first scan: a fresh run, nothing saved yet
        await settle()
        assert seen == []
        cw.writing = True
        await settle()
        assert seen and set(seen) == {"checkpoint_writing"}
        cw.writing, cw.saved = False, 2000.0
        await settle()
        assert seen[-1] == "checkpoint" and seen.count("checkpoint") == 1
        cw.saved = 3000.0  # and the next one
        await settle()
        assert seen.count("checkpoint") == 2

    asyncio.run(main())


@pytest.mark.unit
def test_what_the_agent_samples_of_itself_is_judged_by_its_ranks_one_engine(tmp_path: Path) -> None:
    """One engine per rank: the agent's folders' free space and NVML's state go to the engine
    of the rank it watches (the one hot reload reconfigures, whose errors are counted), not to
    a second engine of the same rank kept beside it; its findings carry the rank's run."""
    from rankwatch.config.schema import Config
    from rankwatch.events import DiskSample, NvmlHang
    from rankwatch.runtime.agent import Agent
    from rankwatch.runtime.services import Services

    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, IDENT)
    w = agent.add_watcher([])
    svc = Services(agent, cfg)
    assert svc.engine(agent=True) is w.engine
    full = DiskSample({str(tmp_path): "log"}, free=0, total=1 << 30, time=1.0, wall=1.7e9)
    svc.push(full, agent=True)
    svc.push(NvmlHang(2.0, None), agent=True)
    assert svc.engines == {} and list(w.engines) == [IDENT.rank]
    low = [f for f in agent.findings if f.kind == "disk_low"]
    assert len(low) == 1 and low[0].rank == IDENT.rank and low[0].run == IDENT.run

    # A node daemon: no watcher is the agent's own rank, so its own events have an engine here.
    other = Agent(cfg, IDENT)
    other.add_watcher([], dataclasses.replace(IDENT, run="someone-else", rank=3))
    svc2 = Services(other, cfg)
    svc2.push(full, agent=True)
    assert list(svc2.engines) == [IDENT.rank] and [f.kind for f in other.findings] == ["disk_low"]


@pytest.mark.unit
def test_a_findings_way_to_the_sinks_is_wired_in_one_call(tmp_path: Path) -> None:
    """The cross-rank hold, the enricher and the alert dispatcher are the agent's named parts,
    set by one ``wire`` call: no module fills a list of hooks on the agent."""
    from rankwatch.config.schema import Config
    from rankwatch.records import Finding, Severity
    from rankwatch.runtime.agent import Agent

    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    sent: list[str] = []
    order: list[str] = []

    class Sink:
        def send(self, f: Finding) -> None:
            sent.append(f"sink:{f.message}")

    class Alerts(Sink):
        def send(self, f: Finding) -> None:
            sent.append(f"alerts:{f.message}")

        def dumps_taken(self, outcome: object) -> None:
            order.append("dumps")

    class Judge:
        def hold(self, f: Finding) -> bool:
            order.append("hold")
            return f.message == "held"

        def clean_exit(self, rank: int | None, step: int | None, t: float, run: str | None = None) -> None:
            order.append(f"exit:{rank}:{step}:{run}")

    agent = Agent(cfg, IDENT, sinks=[Sink()])
    agent.wire(
        cross_rank=Judge(),
        enrich=lambda f: dataclasses.replace(f, message=f.message.upper()),
        alerts=Alerts(),
    )
    agent.emit(Finding(kind="oom", severity=Severity.CRITICAL, rank=0, message="held"))
    agent.emit(Finding(kind="oom", severity=Severity.CRITICAL, rank=0, message="out"))
    agent.clean_exit(0, 12, 1.7e9, "svc")
    assert sent == ["sink:OUT", "alerts:OUT"]
    assert order == ["hold", "hold", "exit:0:12:svc"]


@pytest.mark.unit
def test_a_source_for_every_rank_reaches_each_ranks_engine_on_its_own_clock(tmp_path: Path) -> None:
    """``scope = "ranks"``: one sample, handed to every watched rank's engine with ``now`` from
    that rank's clock; a sample that only reads its inputs runs on the loop (no thread); a scope
    the runtime does not know is refused when the source is polled."""
    import threading
    from typing import ClassVar

    from rankwatch.config.schema import Config
    from rankwatch.events import Event, Tick
    from rankwatch.runtime.agent import Agent
    from rankwatch.runtime.services import Services
    from rankwatch.sources.polled import EveryRank

    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, IDENT)
    clocks = {0: 10.0, 1: 20.0}
    ws = [
        agent.add_watcher([], dataclasses.replace(IDENT, rank=r, local_rank=r, world_size=2)) for r in clocks
    ]
    seen: list[tuple[int | None, float, str]] = []
    for w in ws:
        w.clock = lambda r=w.rank: clocks[r]  # type: ignore[misc]
        w.push = lambda e, r=w.rank: seen.append((r, e.now, threading.current_thread().name)) or []  # type: ignore[method-assign,misc]

    class Timer(EveryRank):
        name: ClassVar[str] = "timer"
        interval = 5.0

        def inputs(self) -> float:
            return 1.7e9

        def sample(self, inputs: float) -> list[Event]:
            return [Tick(0.0, inputs)]

    class Odd(Timer):
        name: ClassVar[str] = "odd"
        scope: ClassVar[str] = "everywhere"

    svc = Services(agent, cfg)
    svc.add_source(Timer())
    svc.add_source(Odd())

    async def main() -> None:
        assert await svc.poll("timer") == [Tick(0.0, 1.7e9)]
        with pytest.raises(TypeError, match="everywhere"):
            await svc.poll("odd")

    asyncio.run(main())
    me = threading.current_thread().name
    assert seen == [(0, 10.0, me), (1, 20.0, me)]
    assert svc.engines == {} and agent.sampled["timer"] == (Tick(0.0, 1.7e9),)
