"""Alert routing and delivery against real loopback servers (a fake Slack Web API, a webhook receiver).

Timing that is policy (repeat interval, startup quiet, rate limit, grouping) runs on a fake
clock; timing that is network (Retry-After, backoff, client timeouts) is measured for real
at the server, with short values.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from conftest import FakeClock, until
from rankwatch.actions.alerts import AlertDispatcher, AlertMessage, DeliveryError, sinks_from_config
from rankwatch.actions.alerts._alertmanager import alertname
from rankwatch.actions.alerts._alertmanager import payload as am_payload
from rankwatch.actions.alerts._slack import SlackSink
from rankwatch.actions.alerts._webhook import WebhookSink
from rankwatch.actions.alerts.message import AlertMember, rank_list, suspect_rank
from rankwatch.actions.alerts.spool import Spool, SpoolEntry, spool_path
from rankwatch.actions.dump_outcome import DumpOutcome
from rankwatch.config.schema import AlertmanagerConfig, AlertsConfig, SlackConfig, WebhookConfig
from rankwatch.identity import Identity
from rankwatch.records import Diagnosis, Finding, Severity

IDENT = Identity(run="job42", rank=3, local_rank=3, world_size=8, node="gpu-node-7")
STALL_MSG = (
    "no progress for 12m (timeout 10m = 10 x p99 step interval); last step 1200; process alive, "
    "idle (CPU 0.4%): blocked in a collective. Usual fix: check the rank that differs in the dumps."
)


def stall(rank: int | None = 3, *, resolved: bool = False, **evidence: Any) -> Finding:
    return Finding(
        kind="stall",
        severity=Severity.CRITICAL,
        rank=rank,
        message="progress resumed" if resolved else STALL_MSG,
        step=1200,
        evidence=evidence,
        resolved=resolved,
    )


def finding(kind: str, rank: int = 0, severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding(kind=kind, severity=severity, rank=rank, message=f"{kind} on rank {rank}", step=10)


def config(tmp_path: Path, **kw: Any) -> AlertsConfig:
    base: dict[str, Any] = dict(
        startup_quiet=0.0, group_wait=0.0, spool_dir=str(tmp_path / "spool"), backoff_max=5.0
    )
    base.update(kw)
    return AlertsConfig(**base)


@dataclass
class RecordingSink:
    name: str = "rec"
    fail: int = 0
    alerts: list[AlertMessage] = field(default_factory=list)
    attempts: int = 0

    async def deliver(self, alert: AlertMessage) -> None:
        self.attempts += 1
        if self.fail:
            self.fail -= 1
            raise DeliveryError("down")
        self.alerts.append(alert)


async def settle(d: AlertDispatcher) -> None:
    """Wait until the dispatcher has acted on a fake-clock advance; negative checks follow."""
    d.wake()
    await until(d.settled)


# --- loopback servers ----------------------------------------------------------------------
@dataclass
class Server:
    url: str
    requests: list[tuple[float, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    script: list[str] = field(default_factory=list)
    default: str = "ok"
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def bodies(self) -> list[dict[str, Any]]:
        return [b for _, b, _ in self.requests]


@asynccontextmanager
async def serve(path: str, *, slack: bool) -> AsyncIterator[Server]:
    srv = Server(url="")

    async def handle(request: web.Request) -> web.StreamResponse:
        srv.requests.append((time.monotonic(), await request.json(), dict(request.headers)))
        what = srv.script.pop(0) if srv.script else srv.default
        if what == "hang":
            await srv.release.wait()
            return web.Response(status=503)
        if what == "429":
            return web.json_response(
                {"ok": False, "error": "ratelimited"}, status=429, headers={"Retry-After": "1"}
            )
        if what == "500":
            return web.Response(status=500, text="Internal Server Error")
        if what == "invalid_auth":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if slack:
            return web.json_response({"ok": True, "channel": "C1", "ts": f"{len(srv.requests)}.000100"})
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post(path, handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    srv.url = f"http://127.0.0.1:{port}"
    try:
        yield srv
    finally:
        srv.release.set()
        await runner.cleanup()


def slack_sink(srv: Server, timeout: float = 5.0) -> SlackSink:
    cfg = SlackConfig(token="xoxb-test", channel="C0ALERTS", base_url=srv.url + "/api/", timeout=timeout)
    return SlackSink(cfg)


@asynccontextmanager
async def running(d: AlertDispatcher, close_timeout: float = 1.0) -> AsyncIterator[AlertDispatcher]:
    task = asyncio.create_task(d.run())
    try:
        yield d
    finally:
        await d.close(close_timeout)
        await asyncio.wait_for(task, 2.0)


def texts(body: dict[str, Any]) -> str:
    return json.dumps(body["blocks"])


# --- Slack ---------------------------------------------------------------------------------
@pytest.mark.process
def test_slack_block_kit_content_and_threaded_resolve(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            cfg = config(
                tmp_path,
                grafana_url="https://grafana.example/d/rw?var-run={run}&var-rank={rank}",
                report_url="https://{node}:9478/incidents/{incident}?run={run}",
            )
            d = AlertDispatcher(cfg, IDENT, sinks=[slack_sink(srv)])
            async with running(d):
                found = stall()
                found.diagnosed(incident="/dumps/job42/20250101T000000Z_stall")
                d.send(found)
                await until(lambda: len(srv.requests) == 1)
                d.send(stall(resolved=True))
                await until(lambda: len(srv.requests) == 2)
            (_, first, headers), (_, second, _) = srv.requests
            assert headers["Authorization"] == "Bearer xoxb-test"
            assert first["channel"] == "C0ALERTS" and "thread_ts" not in first
            header = first["blocks"][0]["text"]["text"]
            assert ":rotating_light:" in header and "CRITICAL" in header
            assert "stall on rank 3" in header and "job42" in header
            fields = " ".join(f["text"] for f in first["blocks"][1]["fields"])
            for want in ("*Run*\n`job42`", "*Rank*\n3", "*Node*\ngpu-node-7", "*Step*\n1200", "critical"):
                assert want in fields
            blob = texts(first)
            assert "Usual fix: check the rank that differs" in blob
            assert "/dumps/job42/20250101T000000Z_stall" in blob
            assert "<https://grafana.example/d/rw?var-run=job42&amp;var-rank=3|Open in Grafana>" in blob
            report = "https://gpu-node-7:9478/incidents/20250101T000000Z_stall?run=job42"
            assert f"<{report}|Open the incident report>" in blob
            assert "stall on rank 3" in first["text"]
            assert second["thread_ts"] == "1.000100"
            assert "RESOLVED" in second["blocks"][0]["text"]["text"]
            assert ":white_check_mark:" in second["blocks"][0]["text"]["text"]
            assert d.stats["slack"] == {"sent": 2, "failed": 0, "dropped": 0, "retried": 0}

    asyncio.run(go())


@pytest.mark.process
def test_slack_message_carries_the_crash_evidence_within_the_block_limit(tmp_path: Path) -> None:
    """A crash's traceback and log tail exist only in the evidence: the message must show them."""
    frames = [f'  File "/app/model.py", line {i}, in layer_{i}' for i in range(500)]
    error = "RuntimeError: CUDA error: <illegal> & memory"
    traceback = ["Traceback (most recent call last):", *frames, error]
    crash = Finding(
        kind="crash",
        severity=Severity.CRITICAL,
        rank=3,
        message="rank 3 exited with code 1 after step 1200. Cause (cuda_error): CUDA error.",
        step=1200,
        evidence={
            "exit_code": 1,
            "signal": None,
            "traceback": traceback,
            "tail": [*traceback[-2:], "srun: error: gpu-node-7: task 3: Exited with exit code 1"],
        },
    )

    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            d = AlertDispatcher(config(tmp_path), IDENT, sinks=[slack_sink(srv)])
            async with running(d):
                d.send(crash)
                await until(lambda: len(srv.requests) == 1)
            texts = [b.get("text", {}).get("text", "") for b in srv.bodies()[0]["blocks"]]
            assert all(len(t) <= 3000 for t in texts)
            code = next(t for t in texts if t.startswith("```"))
            assert "RuntimeError: CUDA error: &lt;illegal&gt; &amp; memory" in code
            assert "srun: error: gpu-node-7: task 3: Exited with exit code 1" in code
            assert "exit_code: 1" in code and "layer_499" in code
            assert code.count("RuntimeError") == 1  # the tail does not repeat the traceback

    asyncio.run(go())


@pytest.mark.process
def test_slack_429_retry_after_is_honoured(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            srv.script = ["429"]
            d = AlertDispatcher(config(tmp_path), IDENT, sinks=[slack_sink(srv)], rng=lambda: 0.0)
            async with running(d):
                d.send(stall())
                await until(lambda: len(srv.requests) == 2)
            (t1, _, _), (t2, _, _) = srv.requests
            assert t2 - t1 >= 1.0
            assert d.stats["slack"] == {"sent": 1, "failed": 1, "dropped": 0, "retried": 1}

    asyncio.run(go())


@pytest.mark.process
def test_slack_500_retried_with_exponential_backoff(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            srv.script = ["500", "500"]
            cfg = config(tmp_path)
            d = AlertDispatcher(cfg, IDENT, sinks=[slack_sink(srv)], rng=lambda: 1.0, backoff_base=0.1)
            spool = spool_path(cfg.spool_dir, IDENT.run, IDENT.rank)
            async with running(d):
                d.send(stall())
                await until(lambda: len(srv.requests) == 2)
                assert spool.exists()  # undelivered after a failure: on disk
                await until(lambda: len(srv.requests) == 3)
                await until(lambda: d.stats["slack"]["sent"] == 1)
                await until(lambda: not spool.exists())
            t = [r[0] for r in srv.requests]
            assert t[1] - t[0] >= 0.1 and t[2] - t[1] >= 0.2
            assert d.stats["slack"] == {"sent": 1, "failed": 2, "dropped": 0, "retried": 2}

    asyncio.run(go())


@pytest.mark.process
def test_slack_invalid_auth_is_permanent(tmp_path: Path, caplog: Any) -> None:
    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            srv.default = "invalid_auth"
            d = AlertDispatcher(config(tmp_path), IDENT, sinks=[slack_sink(srv)], rng=lambda: 0.0)
            async with running(d):
                d.send(stall())
                await until(lambda: d.stats["slack"]["dropped"] == 1)
                await asyncio.sleep(0.2)
            assert len(srv.requests) == 1
            assert d.stats["slack"] == {"sent": 0, "failed": 1, "dropped": 1, "retried": 0}

    with caplog.at_level(logging.ERROR):
        asyncio.run(go())
    assert any(
        "invalid_auth" in r.getMessage() and "SLACK_BOT_TOKEN" in r.getMessage() for r in caplog.records
    )


@pytest.mark.process
def test_slack_hang_times_out_and_retries(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            srv.script = ["hang"]
            d = AlertDispatcher(
                config(tmp_path), IDENT, sinks=[slack_sink(srv, timeout=0.3)], rng=lambda: 0.0
            )
            async with running(d):
                d.send(stall())
                await until(lambda: d.stats["slack"]["sent"] == 1)
            (t1, _, _), (t2, _, _) = srv.requests
            assert t2 - t1 >= 0.3
            assert d.stats["slack"]["failed"] == 1 and d.stats["slack"]["retried"] == 1

    asyncio.run(go())


@pytest.mark.process
def test_slack_incoming_webhook_mode_retries_5xx(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve("/services/T0/B0/secret", slack=False) as srv:
            srv.script = ["500"]
            sink = SlackSink(SlackConfig(webhook_url=srv.url + "/services/T0/B0/secret", timeout=2.0))
            d = AlertDispatcher(config(tmp_path), IDENT, sinks=[sink], rng=lambda: 0.0)
            async with running(d):
                d.send(stall())
                await until(lambda: d.stats["slack"]["sent"] == 1)
            assert len(srv.requests) == 2
            body = srv.requests[1][1]
            assert "stall on rank 3" in body["text"] and body["blocks"][0]["type"] == "header"
            assert d.stats["slack"]["retried"] == 1

    asyncio.run(go())


@pytest.mark.process
def test_slack_resolve_goes_in_the_thread_another_agent_started(tmp_path: Path) -> None:
    """With one agent per rank the grouped resolve is often sent by another agent than the
    firing: it still lands in the firing's thread, found beside the alert board."""
    from rankwatch.actions.alerts.threads import ThreadStore

    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            dumps = tmp_path / "dumps"
            d = AlertDispatcher(config(tmp_path), IDENT, sinks=[slack_sink(srv)], dumps_dir=dumps)
            async with running(d):  # rank 3's agent: its firing's thread id is shared
                d.send(stall())
                await until(lambda: len(srv.requests) == 1)
            shared = dumps / "job42" / ".alerts" / "slack-threads"
            await until(lambda: (shared / "stall-r3.json").exists())
            other = slack_sink(srv)  # the agent of rank 0, leading the grouped resolve
            other.share_threads(ThreadStore(shared))
            members = [AlertMember(0, "progress resumed", 1300), AlertMember(3, "progress resumed", 1300)]
            await other.deliver(AlertMessage("job42", "stall", Severity.CRITICAL, "resolved", members, "n"))
            assert srv.requests[-1][1]["thread_ts"] == "1.000100"
            assert not (shared / "stall-r3.json").exists()  # the episode is over

    asyncio.run(go())


@pytest.mark.unit
def test_thread_store_ignores_what_it_cannot_use(tmp_path: Path) -> None:
    from rankwatch.actions.alerts.threads import ThreadStore

    store = ThreadStore(tmp_path / "t")
    assert store.get("stall", [3], "C1", 1000.0) is None  # nothing yet, no folder
    store.put("stall", [3, 4], "C1", "9.000100", 1000.0)
    assert store.get("stall", [5, 4], "C1", 1001.0) == "9.000100"
    assert store.get("stall", [3], "C2", 1001.0) is None  # another channel's thread
    assert store.get("stall", [3], "C1", 1000.0 + 8 * 86400) is None  # too old to continue
    (tmp_path / "t" / "stall-r3.json").write_text("{torn")
    assert store.get("stall", [3], "C1", 1001.0) is None
    store.drop("stall", [3, 4, 9])
    assert not list((tmp_path / "t").glob("*.json"))


# --- routing policy (fake clock) -------------------------------------------------------------
@pytest.mark.unit
def test_retry_after_is_capped_at_backoff_max(tmp_path: Path) -> None:
    """A server asking for a day's pause gets backoff_max (5 s here), not a parked queue."""

    @dataclass
    class Throttled(RecordingSink):
        async def deliver(self, alert: AlertMessage) -> None:
            self.attempts += 1
            if self.attempts == 1:
                raise DeliveryError("rate limited", retry_after=86400.0)
            self.alerts.append(alert)

    async def go() -> None:
        clock = FakeClock()
        sink = Throttled()
        d = AlertDispatcher(config(tmp_path), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            d.send(stall())
            await until(lambda: d.stats["rec"]["retried"] == 1)  # the retry is scheduled: now + 5 s
            clock.advance(4.9)
            await settle(d)
            assert sink.alerts == []
            clock.advance(0.2)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)

    asyncio.run(go())


@pytest.mark.unit
def test_dedup_and_repeat_interval(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path, repeat_interval=600.0), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            d.send(stall())
            await until(lambda: len(sink.alerts) == 1)
            d.send(stall())
            clock.advance(599)
            await settle(d)
            assert len(sink.alerts) == 1
            clock.advance(2)
            await settle(d)
            await until(lambda: len(sink.alerts) == 2)
            assert sink.alerts[1].repeat and sink.alerts[1].title == "still firing: stall on rank 3"
            d.send(stall(resolved=True))
            await until(lambda: len(sink.alerts) == 3)
            clock.advance(1000)
            await settle(d)
            assert [a.status for a in sink.alerts] == ["firing", "firing", "resolved"]
            d.send(stall())  # a new incident after the resolve alerts again
            await until(lambda: len(sink.alerts) == 4)

    asyncio.run(go())


@pytest.mark.unit
def test_grouping_four_ranks_into_one_message(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        cfg = config(tmp_path, group_wait=5.0)
        d = AlertDispatcher(cfg, IDENT, sinks=[sink], clock=clock, ranks=range(8))  # sees all 8
        async with running(d):
            for r in range(4):
                d.send(stall(r, classification="busy" if r == 2 else "idle"))
                clock.advance(1)
                await settle(d)
            assert sink.alerts == []
            clock.advance(1.1)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)
            a = sink.alerts[0]
            assert a.title == "stall on 4 of 8 ranks, suspect rank 2"
            assert a.ranks == [0, 1, 2, 3] and a.rank == 2
            d.send(stall(6))  # after the window: its own message
            clock.advance(5.1)
            await settle(d)
            await until(lambda: len(sink.alerts) == 2)
            assert sink.alerts[1].title == "stall on rank 6"

    asyncio.run(go())


@pytest.mark.unit
def test_grouped_title_claims_the_world_size_only_when_every_rank_is_seen(tmp_path: Path) -> None:
    """A per-node agent watching ranks 8-11 of 32 must not say "4 of 32": 28 unseen ranks may be
    stalled too."""

    async def go() -> None:
        sink = RecordingSink()
        ident = Identity(run="job42", rank=None, local_rank=None, world_size=32, node="gpu-node-3")
        d = AlertDispatcher(config(tmp_path), ident, sinks=[sink], ranks=range(8, 12))
        async with running(d):
            for r in range(8, 12):
                d.send(stall(r))
            await until(lambda: len(sink.alerts) == 1)
        assert sink.alerts[0].title == "stall on 4 ranks (8-11)"

    asyncio.run(go())


@pytest.mark.unit
def test_startup_quiet_holds_then_sends_what_is_still_active(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path, startup_quiet=60.0), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            await settle(d)
            clock.advance(10)
            d.send(finding("nan_loss", 0))
            d.send(stall(1))
            clock.advance(10)
            d.send(stall(1, resolved=True))
            clock.advance(39)
            await settle(d)
            assert sink.alerts == []
            clock.advance(2)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)
            await settle(d)
            assert [a.kind for a in sink.alerts] == ["nan_loss"]

    asyncio.run(go())


@pytest.mark.unit
def test_flapping_within_group_wait_stays_silent(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path, group_wait=5.0), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            d.send(stall(1))
            d.send(stall(1, resolved=True))  # cleared before its group left: never announced
            clock.advance(6)
            await settle(d)
            assert sink.alerts == []
            d.send(stall(1))
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)
            d.send(stall(1, resolved=True))
            d.send(stall(1))  # back before the resolve left: neither is sent
            clock.advance(6)
            await settle(d)
            assert [a.status for a in sink.alerts] == ["firing"]
            d.send(finding("stall", 1, Severity.CRITICAL))  # still the same active alert
            d.send(stall(1, resolved=True))
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 2)
            assert sink.alerts[1].status == "resolved" and sink.alerts[1].ranks == [1]

    asyncio.run(go())


def gpu_hot(uuid: str, rank: int = 3, *, resolved: bool = False) -> Finding:
    msg = f"GPU {uuid} back to 70 C" if resolved else f"GPU {uuid} at 91 C"
    return Finding("gpu_hot", Severity.WARNING, rank, msg, 10, resolved=resolved, subject=uuid)


@pytest.mark.unit
def test_two_gpus_of_one_rank_are_two_alerts_and_each_resolves_alone(tmp_path: Path) -> None:
    """Keyed on (run, rank, kind), the second GPU's firing was swallowed as a repeat of the first,
    and the first GPU to cool resolved the alert while the second was still hot."""

    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        am = ForgetfulReceiver(name="am")
        d = AlertDispatcher(config(tmp_path, group_wait=5.0), IDENT, sinks=[sink, am], clock=clock)
        async with running(d):
            d.send(gpu_hot("GPU-aaa"))
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)
            d.send(gpu_hot("GPU-bbb"))  # a second GPU of the same rank: news, not a repeat
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 2)
            d.send(gpu_hot("GPU-aaa", resolved=True))  # the first cools; the second is still hot
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 3)
            clock.advance(61)  # Alertmanager gets what is still active re-posted
            await settle(d)
            await until(lambda: sum(a.status == "firing" for a in am.alerts) == 3)
            d.send(gpu_hot("GPU-aaa", resolved=True))  # said twice: nothing more to resolve
            d.send(gpu_hot("GPU-bbb", resolved=True))
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 4)
        got = [(a.status, [(m.rank, m.subject) for m in a.members]) for a in sink.alerts]
        assert got == [
            ("firing", [(3, "GPU-aaa")]),
            ("firing", [(3, "GPU-bbb")]),
            ("resolved", [(3, "GPU-aaa")]),
            ("resolved", [(3, "GPU-bbb")]),
        ]
        refreshed = [a for a in am.alerts if a.status == "firing"][-1]
        assert [m.subject for m in refreshed.members] == ["GPU-bbb"]
        labels = [doc["labels"] for doc in am_payload(refreshed, now=1.7e9)]
        assert [lab.get("subject") for lab in labels] == ["GPU-bbb"]
        both = AlertMessage(
            "job42",
            "gpu_hot",
            Severity.WARNING,
            "firing",
            sink.alerts[0].members + sink.alerts[1].members,
            "n",
        )
        assert both.title == "gpu_hot on rank 3 (GPU-aaa, GPU-bbb)"

    asyncio.run(go())


@pytest.mark.unit
def test_a_resolve_and_a_repeat_carry_the_id_of_their_firing(tmp_path: Path) -> None:
    """A webhook receiver that matches a resolve to its firing by `id` (the payload's own
    identifier) closes what it opened: the repeat and the resolve of an alert carry its firing's
    id; the next episode has its own (black-box d02, d15, d17: every message had a new id)."""

    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(
            config(tmp_path, group_wait=5.0, repeat_interval=100.0), IDENT, sinks=[sink], clock=clock
        )
        async with running(d):
            d.send(gpu_hot("GPU-aaa"))
            d.send(gpu_hot("GPU-aaa", rank=4))
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)
            clock.advance(101)  # still active: repeated
            await settle(d)
            await until(lambda: len(sink.alerts) == 2)
            d.send(gpu_hot("GPU-aaa", resolved=True))
            d.send(gpu_hot("GPU-aaa", rank=4, resolved=True))
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 3)
            d.send(gpu_hot("GPU-aaa"))  # a new episode
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 4)
        got = [(a.status, a.repeat, a.ranks) for a in sink.alerts]
        assert got == [
            ("firing", False, [3, 4]),
            ("firing", True, [3, 4]),
            ("resolved", False, [3, 4]),
            ("firing", False, [3]),
        ]
        firing, repeat, resolve, again = sink.alerts
        assert repeat.id == firing.id and resolve.id == firing.id
        assert again.id != firing.id
        # Two episodes, two ids.
        assert len({a.to_json()["id"] for a in sink.alerts}) == 2

    asyncio.run(go())


@pytest.mark.process
def test_slack_resolve_of_one_gpu_goes_in_that_gpus_thread(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            shared = tmp_path / "threads"
            d = AlertDispatcher(config(tmp_path), IDENT, sinks=[slack_sink(srv)])
            async with running(d):
                d.send(gpu_hot("GPU-aaa"))
                await until(lambda: len(srv.requests) == 1)
                d.send(gpu_hot("GPU-bbb"))
                await until(lambda: len(srv.requests) == 2)
                d.send(gpu_hot("GPU-aaa", resolved=True))
                await until(lambda: len(srv.requests) == 3)
            assert srv.bodies()[2]["thread_ts"] == "1.000100"  # GPU-aaa's firing, not GPU-bbb's
            from rankwatch.actions.alerts.threads import ThreadStore

            store = ThreadStore(shared)
            store.put("gpu_hot", [(3, "GPU-aaa")], "C1", "5.000100", 1000.0)
            store.put("gpu_hot", [(3, "GPU-bbb"), 3], "C1", "6.000100", 1000.0)
            assert store.get("gpu_hot", [(3, "GPU-aaa")], "C1", 1001.0) == "5.000100"
            assert store.get("gpu_hot", [3], "C1", 1001.0) == "6.000100"

    asyncio.run(go())


@pytest.mark.unit
def test_dump_path_noted_after_the_finding_is_in_the_message(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path, group_wait=5.0), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            d.send(stall(3))
            folder = "/dumps/job42/20250101T000000Z_stall"
            d.dumps_taken(DumpOutcome("captured", folder, (3,)))  # the agent's capture, as data
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)
        assert sink.alerts[0].dump_path == "/dumps/job42/20250101T000000Z_stall"

    asyncio.run(go())


@dataclass
class ForgetfulReceiver(RecordingSink):
    """Like Alertmanager: wants active alerts re-posted."""

    refresh_interval: float = 60.0


@pytest.mark.unit
def test_active_alerts_are_reposted_to_refreshing_sinks(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        am = ForgetfulReceiver(name="am")
        other = RecordingSink()
        d = AlertDispatcher(config(tmp_path), IDENT, sinks=[am, other], clock=clock)
        async with running(d):
            d.send(stall(3))
            await until(lambda: len(am.alerts) == 1 and len(other.alerts) == 1)
            clock.advance(61)
            await settle(d)
            await until(lambda: len(am.alerts) == 2)
            assert am.alerts[1].starts_at == am.alerts[0].starts_at and am.alerts[1].status == "firing"
            d.send(stall(3, resolved=True))
            await until(lambda: len(am.alerts) == 3)
            clock.advance(61)
            await settle(d)
        assert [a.status for a in am.alerts] == ["firing", "firing", "resolved"]
        assert len(other.alerts) == 2  # the re-post is for the forgetful sink only

    asyncio.run(go())


@pytest.mark.unit
def test_no_spool_folder_until_an_alert_must_be_remembered(tmp_path: Path) -> None:
    """The spool folder (``alerts.spool_dir``, relative to the job's working directory by
    default) holds undelivered alerts and what a restarted agent must know: an alert firing or
    announced. A run with nothing of that leaves no folder behind; an announced one is kept."""

    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path, group_wait=5.0), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            d.send(finding("loss_plateau", 0, Severity.INFO))  # below min_severity: no alert
            d.send(stall(1))
            d.send(stall(1, resolved=True))  # cleared before its group left: never announced
            clock.advance(6)
            await settle(d)
        assert sink.alerts == [] and not (tmp_path / "spool").exists()
        d = AlertDispatcher(config(tmp_path), IDENT, sinks=[sink])
        async with running(d):
            d.send(stall(2))
            await until(lambda: len(sink.alerts) == 1)
            await settle(d)
        assert [p.name for p in (tmp_path / "spool").iterdir()] == [
            f"{IDENT.run}.rank-{IDENT.rank}.state.json"
        ]

    asyncio.run(go())


@pytest.mark.unit
def test_below_min_severity_never_alerts(tmp_path: Path) -> None:
    async def go() -> None:
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path), IDENT, sinks=[sink])
        async with running(d):
            d.send(finding("loss_plateau", 0, Severity.INFO))
            d.send(finding("throughput_drop", 0, Severity.WARNING))
            await until(lambda: len(sink.alerts) == 1)
            await settle(d)
        assert [a.kind for a in sink.alerts] == ["throughput_drop"]

    asyncio.run(go())


@pytest.mark.unit
def test_rate_limit_queues_excess_without_dropping(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path, rate_limit_per_minute=2), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            for kind in ("nan_loss", "oom", "stall"):
                d.send(finding(kind))
            await until(lambda: len(sink.alerts) == 2)
            clock.advance(29)
            await settle(d)
            assert len(sink.alerts) == 2
            # Held back by the rate limit: on disk, so a SIGKILL now does not lose it.
            assert [e.alert["kind"] for e in d.spool.load()] == ["stall"]
            clock.advance(2)  # one token per 30 s
            await settle(d)
            await until(lambda: len(sink.alerts) == 3)
            await until(lambda: d.spool.load() == [])
        assert [a.kind for a in sink.alerts] == ["nan_loss", "oom", "stall"]
        assert d.stats["rec"]["dropped"] == 0

    asyncio.run(go())


@pytest.mark.unit
def test_retries_exhausted_drop_once_and_count(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink(fail=100)
        cfg = config(tmp_path, max_retries=2)
        # base 10 ms: the two waits are 5 and 10 ms (on the fake clock)
        d = AlertDispatcher(cfg, IDENT, sinks=[sink], clock=clock, rng=lambda: 0.0, backoff_base=0.01)
        async with running(d):
            d.send(stall())
            await settle(d)
            assert sink.attempts == 1
            for _ in range(2):
                clock.advance(0.011)
                await settle(d)
            assert d.stats["rec"]["dropped"] == 1
            clock.advance(3600.0)  # a fourth attempt would be due by now: it must not come
            await settle(d)
        assert sink.attempts == 3
        assert d.stats["rec"] == {"sent": 0, "failed": 3, "dropped": 1, "retried": 2}
        assert not spool_path(cfg.spool_dir, IDENT.run, IDENT.rank).exists()

    asyncio.run(go())


@pytest.mark.unit
def test_each_sink_retries_by_its_own_policy(tmp_path: Path) -> None:
    """A sink may bring its own retry policy (a pager that must not be retried for long); the
    others keep the configured one, whose budget stays 705 s with the defaults."""
    from rankwatch.actions.alerts.delivery import RetryPolicy

    assert RetryPolicy.of(AlertsConfig()).window() == 705.5  # 255.5 s to reach the cap, then 3 x 150 s
    waits = [RetryPolicy(12, 300.0).delay(n, draw) for n in (1, 9, 12) for draw in (0.0, 0.999)]
    assert waits[:2] == [0.5, pytest.approx(1.0, abs=1e-3)] and waits[2] == 128.0 and waits[4] == 150.0
    assert RetryPolicy(12, 300.0).delay(1, 0.0, retry_after=30.0) == 30.0  # a floor, capped ...
    assert RetryPolicy(12, 300.0).delay(1, 0.0, retry_after=1e9) == 300.0  # ... at backoff_max

    @dataclass
    class Impatient(RecordingSink):
        retry_policy: RetryPolicy = field(default_factory=lambda: RetryPolicy(max_retries=0))

    async def go() -> None:
        clock = FakeClock()
        quick, patient = Impatient(name="quick", fail=100), RecordingSink(name="patient", fail=2)
        d = AlertDispatcher(
            config(tmp_path), IDENT, sinks=[quick, patient], clock=clock, rng=lambda: 0.0, backoff_base=0.01
        )
        async with running(d):
            d.send(stall())
            await settle(d)
            assert d.stats["quick"]["dropped"] == 1 and patient.attempts == 1
            for _ in range(2):  # the patient sink's two waits (5 and 10 ms on the clock)
                clock.advance(0.011)
                await settle(d)
            assert len(patient.alerts) == 1
        assert quick.attempts == 1 and patient.attempts == 3
        assert d.stats["quick"]["retried"] == 0 and d.stats["patient"]["retried"] == 2

    asyncio.run(go())


# --- isolation and the spool -----------------------------------------------------------------
@pytest.mark.process
def test_down_sink_does_not_block_other_sink_or_caller(tmp_path: Path) -> None:
    async def go() -> None:
        async with (
            serve("/api/chat.postMessage", slack=True) as slack,
            serve("/hook", slack=False) as hook,
        ):
            slack.default = "hang"
            webhook = WebhookSink(hook.url + "/hook", headers={"Authorization": "Bearer hooktoken"})
            cfg = config(tmp_path)
            d = AlertDispatcher(cfg, IDENT, sinks=[slack_sink(slack, timeout=5.0), webhook])
            async with running(d, close_timeout=0.1):
                t0 = time.monotonic()
                d.send(stall(loss=float("nan"), last_good=Path("/ckpt/step-1100")))
                assert time.monotonic() - t0 < 0.05
                await until(lambda: len(hook.requests) == 1, timeout=1.0)
                assert time.monotonic() - t0 < 1.0
                await until(lambda: len(slack.requests) == 1)
            _, body, headers = hook.requests[0]
            assert headers["Authorization"] == "Bearer hooktoken"
            assert body["version"] == "1" and body["status"] == "firing"
            assert (body["run"], body["rank"], body["ranks"], body["node"]) == ("job42", 3, [3], "gpu-node-7")
            assert (body["kind"], body["severity"], body["step"]) == ("stall", "critical", 1200)
            assert body["message"] == STALL_MSG
            assert body["evidence"] == {"loss": "nan", "last_good": "/ckpt/step-1100"}  # strict JSON
            entries = Spool(spool_path(cfg.spool_dir, IDENT.run, IDENT.rank), 1 << 20).load()
            assert [e.sink for e in entries] == ["slack"]  # the hung delivery was kept for the next start

    asyncio.run(go())


@pytest.mark.process
def test_spool_survives_restart_and_delivers_once(tmp_path: Path) -> None:
    async def go() -> None:
        cfg = config(tmp_path)
        path = spool_path(cfg.spool_dir, IDENT.run, IDENT.rank)
        async with serve("/api/chat.postMessage", slack=True) as srv:
            srv.default = "500"
            d1 = AlertDispatcher(cfg, IDENT, sinks=[slack_sink(srv)], backoff_base=10.0, rng=lambda: 1.0)
            async with running(d1, close_timeout=0.05):
                d1.send(stall())
                d1.send(finding("nan_loss", 3))
                await until(lambda: d1.stats["slack"]["failed"] == 1)
            entries = Spool(path, 1 << 20).load()
            assert len(entries) == 2 and {e.sink for e in entries} == {"slack"}
            srv.default = "ok"
            srv.requests.clear()
            d2 = AlertDispatcher(cfg, IDENT, sinks=[slack_sink(srv)])
            async with running(d2):
                await until(lambda: len(srv.requests) == 2)
                await until(lambda: not path.exists())
                await asyncio.sleep(0.1)
            assert len(srv.requests) == 2
            headers = [b["blocks"][0]["text"]["text"] for b in srv.bodies()]
            assert "stall on rank 3" in headers[0] and "nan_loss on rank 3" in headers[1]
            assert d2.stats["slack"]["sent"] == 2

    asyncio.run(go())


@pytest.mark.unit
def test_a_resolve_names_the_suspect_of_the_firing_it_closes(tmp_path: Path) -> None:
    """A stall on ranks 0 and 1, suspect rank 1: its resolve (progress resumed: no diagnosis of
    its own) carries the same suspect and so the same rank in its payload, not the lowest rank."""

    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink()
        d = AlertDispatcher(config(tmp_path, group_wait=5.0), IDENT, sinks=[sink], clock=clock)
        async with running(d):
            for r in (0, 1):
                f = stall(r)
                f.diagnosed(suspects=(1,))
                d.send(f)
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 1)
            for r in (0, 1):
                d.send(stall(r, resolved=True))
            clock.advance(6)
            await settle(d)
            await until(lambda: len(sink.alerts) == 2)
        firing, resolve = sink.alerts
        assert (firing.status, firing.suspect, firing.rank) == ("firing", 1, 1)
        assert (resolve.status, resolve.suspect, resolve.rank) == ("resolved", 1, 1)
        assert resolve.id == firing.id

    asyncio.run(go())


@pytest.mark.unit
def test_a_spooled_firing_and_its_resolve_are_both_delivered_after_a_restart(tmp_path: Path) -> None:
    """The resolve carries its firing's id: in the spool each is still an entry of its own, so
    the next start loads both (one id per entry: the second was read as a duplicate) and a
    delivered firing takes only its own entry away."""

    async def go() -> None:
        clock = FakeClock()
        cfg = config(tmp_path, backoff_max=1e6)
        down = RecordingSink(fail=1_000)
        d1 = AlertDispatcher(cfg, IDENT, sinks=[down], clock=clock, backoff_base=1e5)
        async with running(d1, close_timeout=0.05):
            d1.send(gpu_hot("GPU-aaa"))
            await until(lambda: down.attempts == 1)
            d1.send(gpu_hot("GPU-aaa", resolved=True))
            clock.advance(1)
            await settle(d1)
        entries = d1.spool.load()
        assert [e.alert["status"] for e in entries] == ["firing", "resolved"]
        assert len({e.alert["id"] for e in entries}) == 1 and len({e.id for e in entries}) == 2
        up = RecordingSink()
        d2 = AlertDispatcher(cfg, IDENT, sinks=[up], clock=clock)
        async with running(d2):
            await until(lambda: len(up.alerts) == 2)
            await until(lambda: d2.spool.load() == [])
        assert [a.status for a in up.alerts] == ["firing", "resolved"]
        assert up.alerts[0].id == up.alerts[1].id

    asyncio.run(go())


@pytest.mark.unit
def test_spool_bound_drops_oldest_and_counts(tmp_path: Path) -> None:
    async def go() -> None:
        clock = FakeClock()
        sink = RecordingSink(fail=1000)
        probe = SpoolEntry("x" * 32 + ":rec", "rec", finding_alert().to_json()).line()
        cfg = config(tmp_path, spool_max_bytes=int(len(probe) * 2.5), backoff_max=1e6)
        d = AlertDispatcher(cfg, IDENT, sinks=[sink], clock=clock, rng=lambda: 1.0, backoff_base=1e6)
        async with running(d, close_timeout=0.0):
            for kind in ("k1", "k2", "k3", "k4"):
                d.send(finding(kind, 3))
            await until(lambda: d.stats["rec"]["dropped"] == 2)
        path = spool_path(cfg.spool_dir, IDENT.run, IDENT.rank)
        assert path.stat().st_size <= cfg.spool_max_bytes
        assert [e.alert["kind"] for e in Spool(path, cfg.spool_max_bytes).load()] == ["k3", "k4"]
        assert d.stats["rec"]["dropped"] == 2

    asyncio.run(go())


@pytest.mark.unit
def test_spooled_alerts_for_a_removed_sink_are_counted_as_dropped(tmp_path: Path, caplog: Any) -> None:
    cfg = config(tmp_path)
    path = spool_path(cfg.spool_dir, IDENT.run, IDENT.rank)
    alert = finding_alert().to_json()
    Spool(path, 1 << 20).append(
        [SpoolEntry("a:webhook-0ld", "webhook-0ld", alert), SpoolEntry("b:rec", "rec", {"kind": "torn"})]
    )

    async def go() -> None:
        d = AlertDispatcher(cfg, IDENT, sinks=[RecordingSink()])
        async with running(d):
            await until(lambda: not path.exists())
        assert d.stats["webhook-0ld"]["dropped"] == 1  # its receiver is gone from the config
        assert d.stats["rec"]["dropped"] == 1  # unreadable entry

    with caplog.at_level(logging.ERROR):
        asyncio.run(go())
    assert any("webhook-0ld dropped (no longer configured)" in r.getMessage() for r in caplog.records)


@pytest.mark.unit
def test_sink_names_follow_the_target_not_its_position() -> None:
    a, b = "http://hooks.example/a", "http://hooks.example/b"
    first = AlertsConfig(webhook=WebhookConfig(urls=[a, b]), alertmanager=AlertmanagerConfig(urls=[a]))
    again = AlertsConfig(webhook=WebhookConfig(urls=[b, a, a]))
    names = {s.url: s.name for s in sinks_from_config(first) if isinstance(s, WebhookSink)}
    assert {s.url: s.name for s in sinks_from_config(again)} == names  # reordered, deduplicated
    assert names[a].startswith("webhook-") and names[a] != names[b]
    assert sinks_from_config(first)[0].name == "alertmanager"  # the only one of its kind
    named = AlertsConfig(webhook=WebhookConfig(urls=[a], names={a: "oncall"}))
    assert [s.name for s in sinks_from_config(named)] == ["oncall"]


def finding_alert() -> AlertMessage:
    return AlertMessage("job42", "k1", Severity.CRITICAL, "firing", [AlertMember(3, "k1 on rank 3", 10)], "n")


@pytest.mark.unit
def test_spool_file_is_per_run_and_rank_and_skips_torn_lines(tmp_path: Path) -> None:
    assert spool_path(tmp_path, "job/42", 3).name == "job_42.rank-3.jsonl"
    assert spool_path(tmp_path, "job42", 3) != spool_path(tmp_path, "job42", 4)
    s = Spool(spool_path(tmp_path, "job42", 3), 1 << 20)
    s.append([SpoolEntry("a", "slack", {"kind": "stall"}), SpoolEntry("b", "slack", {"kind": "oom"})])
    with open(s.path, "ab") as fh:
        fh.write(b'{"v":1,"id":"c","si')  # crash mid-append
    assert [e.id for e in s.load()] == ["a", "b"]
    s.remove({"a"})
    assert [e.id for e in s.load()] == ["b"]
    assert not s.path.with_name(s.path.name + ".tmp").exists()


# --- message content -------------------------------------------------------------------------
@pytest.mark.unit
def test_suspect_rank_and_rank_list() -> None:
    idle = [AlertMember(r, "m", evidence={"classification": "idle"}) for r in range(5)]
    assert suspect_rank(idle) is None
    idle[3].evidence = {"classification": "busy"}
    assert suspect_rank(idle) == 3
    assert suspect_rank([AlertMember(0, "m"), AlertMember(1, "m", diagnosis=Diagnosis(suspects=(5,)))]) == 5
    assert rank_list([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"


@pytest.mark.unit
def test_ranks_each_judged_alone_do_not_outvote_each_other() -> None:
    """Two ranks' crashes judged at once, each before the other's record was there: each names
    itself. Alike (d46: a script that cannot start, the real text): no suspect, and the payload's
    diagnosis says so. Different: the one that started failing first."""
    typo = (
        "/work/venv/bin/python3 could not open the script '/x/trian.py': [Errno 2] No such file or directory."
    )

    def own(r: int, message: str, t: float) -> AlertMember:
        return AlertMember(r, message, diagnosis=Diagnosis(suspects=(r,)), starts_at=t)

    alike = AlertMessage(
        "job", "crash", Severity.CRITICAL, "firing", [own(0, typo, 5.0), own(1, typo, 4.9)], "n"
    )
    assert alike.suspect is None and alike.title == "crash on 2 ranks (0-1)"
    assert alike.diagnosis is not None and alike.diagnosis.verdict == "same_failure"
    assert alike.diagnosis.suspect is None
    bad = "process exited with code 1. Cause (crash): RuntimeError: bad batch 160."
    apart = [own(0, typo, 5.0), own(1, bad, 4.9)]
    assert suspect_rank(apart, "crash") == 1


@pytest.mark.unit
def test_alertmanager_payload_labels_and_resolve() -> None:
    assert alertname("nan_loss") == "RankwatchNanLoss"
    assert alertname("stall") == "RankwatchStall"
    members = [
        AlertMember(r, f"stall on {r}", 5, dump_path="/d" if r == 1 else None, starts_at=1.7e9)
        for r in (0, 1)
    ]
    a = AlertMessage("job42", "stall", Severity.CRITICAL, "firing", members, "gpu-node-7", 8)
    docs = am_payload(a, now=1.7e9 + 60)
    assert [d["labels"]["rank"] for d in docs] == ["0", "1"]
    assert docs[0]["labels"] == {
        "alertname": "RankwatchStall",
        "run": "job42",
        "rank": "0",
        "severity": "critical",
        "kind": "stall",
        "node": "gpu-node-7",
    }
    assert docs[1]["annotations"]["dump_path"] == "/d" and "dump_path" not in docs[0]["annotations"]
    assert docs[0]["startsAt"].endswith("Z") and "endsAt" not in docs[0]
    a.status = "resolved"
    assert am_payload(a, now=1.7e9 + 60)[0]["endsAt"] == "2023-11-14T22:14:20.000Z"
    restored = AlertMessage.from_json(json.loads(json.dumps(a.to_json())))
    assert restored.title == a.title and restored.id == a.id and restored.severity is Severity.CRITICAL


# --- log text cannot command Slack (issue 16 item 5) ---------------------------------------
HOSTILE = (
    "RuntimeError: <!channel> <!here> <@U024BE7LH> <#C024BE7LH> "
    "<https://evil.example/phish|click to view the dashboard> & co > done in <module>"
)


def _hostile_alert(**kw: Any) -> AlertMessage:
    member = AlertMember(
        rank=3,
        message=HOSTILE,
        step=7,
        evidence={"lines": [HOSTILE], "tail": ["<!everyone> tail"], "exit_code": "<!channel>"},
        dump_path="/dumps/<!channel>",
        starts_at=1.0,
    )
    base: dict[str, Any] = dict(
        run="<!channel>", kind="crash", severity=Severity.CRITICAL, status="firing", members=[member],
        node="<@U1>|node",
    )  # fmt: skip
    base.update(kw)
    return AlertMessage(**base)


def _unescaped_sequences(text: str) -> list[str]:
    """Slack control sequences that would act: '<' followed by a mention sigil or a scheme."""
    import re

    return re.findall(r"<(?:[!@#][^>]*|[a-z]+://[^>|]*\|[^>]*)>", text)


@pytest.mark.unit
def test_slack_text_and_blocks_escape_log_text(tmp_path: Path) -> None:
    from rankwatch.actions.alerts._slack import build_blocks, fallback_text

    url = "https://grafana.example/d/rw?var-run={run}"
    alert = _hostile_alert(grafana_url=url.format(run="x>|<!channel>"))
    text = fallback_text(alert)
    assert _unescaped_sequences(text) == [], text
    assert "&lt;!channel&gt;" in text and "&amp; co &gt; done" in text
    mrkdwn: list[str] = []
    for block in build_blocks(alert):
        if block["type"] == "header":
            assert block["text"]["type"] == "plain_text"  # never parsed for mentions
            continue
        if "text" in block:
            mrkdwn.append(block["text"]["text"])
        mrkdwn += [f["text"] for f in block.get("fields", [])]
    joined = "\n".join(mrkdwn)
    links = _unescaped_sequences(joined)
    assert links == ["<https://grafana.example/d/rw?var-run=x%3E%7C%3C!channel%3E|Open in Grafana>"], links
    assert "&lt;https://evil.example/phish|click to view the dashboard&gt;" in joined
    # a link we do not make is never a javascript: one
    assert not any("Open in Grafana" in b.get("text", {}).get("text", "") for b in build_blocks(
        _hostile_alert(grafana_url="javascript:alert(1)")
    ))  # fmt: skip


@pytest.mark.process
def test_slack_post_carries_only_escaped_text(tmp_path: Path) -> None:
    async def go() -> None:
        async with serve("/api/chat.postMessage", slack=True) as srv:
            d = AlertDispatcher(config(tmp_path), IDENT, sinks=[slack_sink(srv)])
            async with running(d):
                d.send(Finding("crash", Severity.CRITICAL, 3, HOSTILE, step=7, evidence={"lines": [HOSTILE]}))
                await until(lambda: len(srv.requests) == 1)
            body = srv.requests[0][1]
            assert _unescaped_sequences(body["text"]) == []
            assert _unescaped_sequences(texts(body).replace("\\n", "\n")) == []

    asyncio.run(go())


@pytest.mark.unit
def test_alertmanager_annotations_defuse_mentions_but_keep_labels_exact() -> None:
    docs = am_payload(_hostile_alert(), now=2.0)
    desc = docs[0]["annotations"]["description"]
    assert _unescaped_sequences(desc) == [] and "\u2039!channel>" in desc
    assert "<module>" in desc  # a traceback's frame name is not a mention
    assert _unescaped_sequences(docs[0]["annotations"]["summary"]) == []
    assert docs[0]["labels"]["run"] == "<!channel>"  # routing matches the exact value


@pytest.mark.unit
def test_sink_errors_never_carry_credentials(tmp_path: Path) -> None:
    async def go() -> None:
        # aiohttp refuses user:pass@ with an Authorization header: permanent, and redacted
        hook = WebhookSink(
            "http://bob:pa55word@127.0.0.1:9/x?token=abc123", headers={"Authorization": "Bearer h00k-secret"}
        )
        try:
            try:
                await hook.deliver(_hostile_alert())
            except DeliveryError as e:
                err = e
            assert err.permanent, err
            for secret in ("pa55word", "abc123", "h00k-secret"):
                assert secret not in str(err) and secret not in hook.where
        finally:
            await hook.aclose()
        am = sinks_from_config(
            AlertsConfig(alertmanager=AlertmanagerConfig(urls=["http://am:s3cr3tpw@127.0.0.1:9/?sig=zzz999"]))
        )
        for sink in am:
            try:
                await sink.deliver(_hostile_alert())
            except DeliveryError as e:
                assert "s3cr3tpw" not in str(e) and "zzz999" not in str(e), str(e)
            finally:
                await sink.aclose()  # type: ignore[attr-defined]

    asyncio.run(go())


# --- log text cannot command a terminal either (issue 26 item 9) ---------------------------
# ESC c (reset), ESC ( 0 (line drawing), DECALN, OSC 52 (writes the reader's clipboard), an
# 8-bit CSI, a bidi override and isolate, a line separator: what a hostile log line holds.
TERMINAL_HOSTILE = (
    "RuntimeError: CUDA error \x1bc\x1b(0\x1b#8\x1b]52;c;cm0gLXJmIC9kYXRh\x07\x9b2J"
    "\u202eatad/ fr- mr\u202c \u2066iso\u2069 \u2028end\r\x7f"
)
_RAW = set(map(chr, [*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]))
_RAW |= set("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029\u200e\u200f\u061c")


def raw_controls(doc: Any) -> list[str]:
    """Every control, escape or bidi character left in the strings of ``doc`` (newlines and
    tabs are text)."""
    if isinstance(doc, str):
        return [c for c in doc if c in _RAW]
    if isinstance(doc, dict):
        return [c for k, v in doc.items() for c in raw_controls(k) + raw_controls(v)]
    if isinstance(doc, list):
        return [c for v in doc for c in raw_controls(v)]
    return []


@pytest.mark.process
def test_slack_webhook_and_alertmanager_show_escapes_never_send_them(tmp_path: Path) -> None:
    """A hostile log line in a crash's message and evidence, and in the run's name, reaches
    each chat face shown (``␛]52;...``), never as a live escape or bidi override."""
    ident = Identity(run="job\x1b]0;owned\x07", rank=3, local_rank=3, world_size=8, node="gpu\u202e7")
    crash = Finding(
        "crash",
        Severity.CRITICAL,
        3,
        f"rank 3 exited with code 1. Cause: {TERMINAL_HOSTILE}",
        step=7,
        evidence={"lines": [TERMINAL_HOSTILE], "tail": [TERMINAL_HOSTILE, "srun: error"], "exit_code": 1},
    )

    async def go() -> None:
        async with (
            serve("/api/chat.postMessage", slack=True) as slack,
            serve("/hook", slack=False) as hook,
            serve("/api/v2/alerts", slack=False) as am,
        ):
            sinks = [
                slack_sink(slack),
                WebhookSink(hook.url + "/hook"),
                *sinks_from_config(AlertsConfig(alertmanager=AlertmanagerConfig(urls=[am.url]))),
            ]
            d = AlertDispatcher(config(tmp_path), ident, sinks=sinks)
            async with running(d):
                d.send(crash)
                await until(lambda: len(slack.requests) == len(hook.requests) == len(am.requests) == 1)
            for srv in (slack, hook, am):
                body = srv.requests[0][1]
                assert raw_controls(body) == [], (srv.url, body)
                blob = json.dumps(body, ensure_ascii=False)
                # still readable: the words are there, each escape shown where it was
                assert "CUDA error" in blob and "\u241bc\u241b(0\u241b#8" in blob, blob
                assert "\u241b]52;c;cm0gLXJmIC9kYXRh\u2407" in blob and "\\\\u202eatad/ fr- mr" in blob

    asyncio.run(go())


@pytest.mark.unit
def test_alertmanager_and_webhook_payloads_show_controls() -> None:
    from rankwatch.actions.alerts._webhook import payload as hook_payload

    alert = _hostile_alert(run="r\x1bc", node="n\u202e1")
    alert.members[0].message = TERMINAL_HOSTILE
    alert.members[0].evidence = {"lines": [TERMINAL_HOSTILE], "nested": {"k\x9b": [TERMINAL_HOSTILE]}}
    for doc in (am_payload(alert, now=2.0), hook_payload(alert)):
        assert raw_controls(doc) == [], doc
        assert "\u241b]52;c;" in json.dumps(doc, ensure_ascii=False)
