"""The Prometheus exposition of a live agent: series, labels, values, lint."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.exposition import generate_latest as om_generate
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families

from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.exporter import make_registry, render
from rankwatch.exporter.process import STATES
from rankwatch.identity import Identity
from rankwatch.records import EvalRecord, Finding, Severity, StepRecord
from rankwatch.runtime.agent import Agent
from rankwatch.runtime.watcher import RankWatcher

IDENT = Identity(run="t", rank=0, local_rank=0, world_size=2, node="n1")
RANK_LABELS = {"run", "rank", "local_rank", "node"}
ALLOWED_LABELS = RANK_LABELS | {
    "kind",
    "severity",
    "state",
    "result",
    "component",
    "sink",
    "version",
    "python",
    "le",  # the fixed buckets of rankwatch_step_time_seconds
    "collector",  # rankwatch_collector_{success,duration_seconds}
}


def _agent(tmp_path: Path, ranks: int = 1) -> Agent:
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, dataclasses.replace(IDENT, world_size=max(2, ranks)))
    for r in range(ranks):
        ident = dataclasses.replace(agent.identity, rank=r, local_rank=r % 8, node=f"n{1 + r // 8}")
        agent.add_watcher([tmp_path / f"rank-{r}.log"], ident)
    return agent


def _steps(w: RankWatcher, n: int, *, t0: float, start: int = 1, total: int = 1000, **extra: float) -> None:
    recs = [
        StepRecord(
            step=i,
            total_steps=total,
            loss=3.0 - 0.001 * i,
            grad_norm=0.8,
            learning_rate=3e-4,
            tokens_per_s=12_000.0,
            step_time_s=0.5,
            tflops=180.5,
            time=t0 + 0.5 * i,
            **extra,
        )
        for i in range(start, start + n)
    ]
    w._records(recs)


def _samples(agent: Agent) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(render(agent).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _one(samples: dict[str, list], name: str, **labels: str):
    hits = [s for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, f"{name} {labels}: {hits}"
    return hits[0].value


@pytest.mark.unit
def test_training_series_carry_identity_labels_and_printed_values(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    w = agent.watchers[0]
    _steps(w, 200, t0=1_700_000_000.0, mfu=0.41, memory_bytes=30e9)
    w._records([EvalRecord(eval_loss=2.75, step=200, time=1_700_000_100.0)])
    s = _samples(agent)
    step = s["rankwatch_step"]
    assert len(step) == 1
    assert step[0].labels == {"run": "t", "rank": "0", "local_rank": "0", "node": "n1"}
    assert step[0].value == 200
    assert _one(s, "rankwatch_total_steps") == 1000
    assert _one(s, "rankwatch_loss") == pytest.approx(2.8)
    assert _one(s, "rankwatch_eval_loss") == 2.75
    assert _one(s, "rankwatch_grad_norm") == 0.8
    assert _one(s, "rankwatch_learning_rate") == 3e-4
    assert _one(s, "rankwatch_tokens_per_second") == 12_000
    assert _one(s, "rankwatch_flops_per_second") == pytest.approx(180.5e12)
    assert _one(s, "rankwatch_mfu_ratio") == 0.41
    assert _one(s, "rankwatch_framework_memory_bytes") == 30e9
    assert _one(s, "rankwatch_step_duration_seconds") == 0.5
    # 2 steps/s from the timestamps, 800 steps to go.
    assert _one(s, "rankwatch_eta_seconds") == pytest.approx(400.0)
    assert _one(s, "rankwatch_last_progress_timestamp_seconds") == 1_700_000_100.0
    assert 0 <= _one(s, "rankwatch_seconds_since_progress") < 5
    # No log line carried these: no series, not a fake zero.
    for absent in ("rankwatch_samples_per_second", "rankwatch_loss_scale", "rankwatch_process_up"):
        assert absent not in s


@pytest.mark.unit
def test_nan_loss_is_exported_as_nan_and_counted_as_a_finding(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    w = agent.watchers[0]
    _steps(w, 150, t0=time.time() - 100)
    w._records([StepRecord(step=151, loss=math.nan, grad_norm=math.inf, time=time.time())])
    text = render(agent).decode()
    line = next(x for x in text.splitlines() if x.startswith("rankwatch_loss{"))
    assert line.endswith(" NaN")
    assert "rankwatch_grad_norm{" in text and "+Inf" in text
    s = _samples(agent)
    assert math.isnan(_one(s, "rankwatch_loss"))
    assert _one(s, "rankwatch_findings_total", kind="nan_loss", severity="critical", rank="0") == 1
    assert _one(s, "rankwatch_active_findings", kind="nan_loss", severity="critical", rank="0") == 1


@pytest.mark.unit
def test_no_job_label_and_every_label_is_bounded(tmp_path: Path) -> None:
    agent = _agent(tmp_path, ranks=3)
    for w in agent.watchers:
        _steps(w, 120, t0=time.time() - 60)
    agent.emit(Finding("stall", Severity.CRITICAL, 1, "no progress for 900s at /some/path", step=120))
    agent.alert_stats = {"slack": {"sent": 1, "failed": 0, "dropped": 0}}  # type: ignore[attr-defined]
    fams = list(text_string_to_metric_families(render(agent).decode()))
    names = {f.name for f in fams}
    assert all(n.startswith(("rankwatch_", "process_")) for n in names)
    for fam in fams:
        assert fam.documentation, fam.name
        for smp in fam.samples:
            assert "job" not in smp.labels
            assert set(smp.labels) <= ALLOWED_LABELS, smp
            for v in smp.labels.values():
                assert "/" not in v and len(v) < 64, smp
            if "state" in smp.labels:
                assert smp.labels["state"] in STATES
            if "result" in smp.labels:
                assert smp.labels["result"] in ("parsed", "unparsed", "cut", "rank_refused", "shed")
    ranks = {smp.labels["rank"] for fam in fams if fam.name == "rankwatch_step" for smp in fam.samples}
    assert ranks == {"0", "1", "2"}


@pytest.mark.unit
def test_findings_counter_never_decreases_when_the_log_is_trimmed(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    reg = make_registry(agent, process=False)

    def total() -> float:
        s = {}
        for fam in text_string_to_metric_families(render(agent, reg).decode()):
            for smp in fam.samples:
                if smp.name == "rankwatch_findings_total" and smp.labels["kind"] == "loss_spike":
                    s[smp.labels["severity"]] = smp.value
        return s.get("warning", 0.0)

    spike = lambda i: Finding("loss_spike", Severity.WARNING, 0, f"spike {i}", step=i)  # noqa: E731
    for i in range(30):
        agent.emit(spike(i))
    assert total() == 30
    for i in range(30, 40):
        agent.emit(spike(i))
    del agent.findings[:25]  # what Agent.emit does past its cap
    assert total() == 40
    agent.findings.clear()
    agent.emit(spike(99))
    assert total() == 41


@pytest.mark.unit
def test_resolved_finding_drops_the_active_gauge_to_zero(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "no progress"))
    s = _samples(agent)
    assert _one(s, "rankwatch_active_findings", kind="stall") == 1
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "progress resumed", resolved=True))
    s = _samples(agent)
    assert _one(s, "rankwatch_active_findings", kind="stall") == 0
    assert _one(s, "rankwatch_findings_total", kind="stall") == 1


@pytest.mark.process
def test_process_metrics_follow_a_real_subprocess(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"], stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"  # asleep from here on
        agent = _agent(tmp_path)
        w = agent.watchers[0]
        w.attach(child.pid)

        async def sample() -> None:
            await w.sample_once()

        for _ in range(100):  # the child may still be between print() and sleep()
            asyncio.run(sample())
            if w.last_sample is not None and w.last_sample.state == "sleeping":
                break
            time.sleep(0.02)
        s = _samples(agent)
        assert _one(s, "rankwatch_process_up") == 1
        assert _one(s, "rankwatch_process_resident_memory_bytes") > 1_000_000
        assert _one(s, "rankwatch_process_threads") >= 1
        assert _one(s, "rankwatch_process_cpu_seconds_total") >= 0
        assert _one(s, "rankwatch_process_cpu_ratio") >= 0
        assert _one(s, "rankwatch_process_children") == 0
        states = {x.labels["state"]: x.value for x in s["rankwatch_process_state"]}
        assert set(states) == set(STATES) and sum(states.values()) == 1
        assert states["sleeping"] == 1
        assert _one(s, "rankwatch_sources_attached") == 1
        child.kill()
        child.wait(10)
        asyncio.run(sample())
        s = _samples(agent)
        assert _one(s, "rankwatch_process_up") == 0
        assert "rankwatch_process_resident_memory_bytes" not in s
    finally:
        child.kill()
        child.wait(10)


MEGATRON = (
    " [2024-05-01 10:00:{sec:02d}] iteration {i:8d}/    1000 | consumed samples: {cs:12d} |"
    " elapsed time per iteration (ms): 512.0 | throughput per GPU (TFLOP/s/GPU): 181.2 |"
    " learning rate: 3.000000E-04 | global batch size:   256 | lm loss: {loss:.6E} |"
    " loss scale: 1.0 | grad norm: 0.812 | number of skipped iterations:   0 |"
    " number of nan iterations:   0 |\n"
)


@pytest.mark.unit
def test_log_file_pipeline_counts_lines_by_outcome(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    w = agent.watchers[0]
    log = tmp_path / "rank-0.log"
    with log.open("w") as fh:
        fh.write("training ...\nsome unrelated line\n")
        for i in range(1, 21):
            fh.write(MEGATRON.format(sec=i, i=i, cs=256 * i, loss=3.0 - 0.01 * i))
    w.drain()
    s = _samples(agent)
    assert _one(s, "rankwatch_step") == 20
    assert _one(s, "rankwatch_flops_per_second") == pytest.approx(181.2e12)
    assert _one(s, "rankwatch_step_duration_seconds") == pytest.approx(0.512)
    assert _one(s, "rankwatch_log_lines_total", result="parsed") == 20
    assert _one(s, "rankwatch_log_lines_total", result="unparsed") == 2
    assert _one(s, "rankwatch_log_lines_total", result="cut") == 0
    assert _one(s, "rankwatch_log_read_bytes_total") == log.stat().st_size
    assert _one(s, "rankwatch_sources_attached") == 1


def _forged_ranks(path: Path, ranks: int) -> None:
    """One step line under each of ``ranks`` ``[rankN]:`` prefixes (torchrun --tee's form)."""
    with path.open("w") as fh:
        fh.writelines(
            f"[rank{r}]: step={s} loss={2.5 - s * 0.001:.4f}\n" for s in (1, 2) for r in range(ranks)
        )


@pytest.mark.unit
def test_rank_labels_from_log_prefixes_stay_inside_the_world(tmp_path: Path) -> None:
    """20,000 [rankN]: prefixes in a world of 2: two label sets, the rest counted and dropped."""
    agent = _agent(tmp_path)  # a world of 2
    w = agent.watchers[0]
    _forged_ranks(tmp_path / "rank-0.log", 20_000)
    w.feed_lines(w.streams[0], w.streams[0].follower.read_available())  # every line, none shed
    fams = list(text_string_to_metric_families(render(agent).decode()))
    label_sets = {
        tuple(sorted(smp.labels.items()))
        for fam in fams
        if fam.name == "rankwatch_step"
        for smp in fam.samples
    }
    assert {dict(x)["rank"] for x in label_sets} == {"0", "1"}
    s = _samples(agent)
    assert _one(s, "rankwatch_log_lines_total", result="rank_refused") == 2 * (20_000 - 2)
    assert len(agent.watchers[0].engines) <= 2


@pytest.mark.unit
def test_rank_labels_are_capped_by_max_ranks_without_a_world_size(tmp_path: Path) -> None:
    cfg = replaced(
        Config(), {"dumps.dir": str(tmp_path / "dumps"), "logs.max_ranks": 16, "logs.shed_backlog": 0}
    )
    agent = Agent(cfg, dataclasses.replace(IDENT, world_size=None))
    agent.add_watcher([tmp_path / "rank-0.log"], agent.identity)
    _forged_ranks(tmp_path / "rank-0.log", 5_000)
    agent.watchers[0].drain()
    text = render(agent).decode()
    ranks = {
        smp.labels["rank"]
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
        if fam.name == "rankwatch_step"
    }
    assert len(ranks) == 16 and len(agent.watchers[0].engines) <= 17
    assert _one(_samples(agent), "rankwatch_log_lines_total", result="rank_refused") == 2 * (5_000 - 16)
    assert len(text) < 200_000


@pytest.mark.unit
def test_agent_health_alert_counters_and_internal_errors(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    s = _samples(agent)
    assert not any(n.startswith("rankwatch_alerts_") for n in s)
    info = s["rankwatch_build_info"][0]
    assert info.value == 1 and set(info.labels) == {"version", "python"}
    assert _one(s, "rankwatch_internal_errors_total", component="server") == 0
    agent.alert_stats = {"slack": {"sent": 3, "failed": 2, "dropped": 1}}  # type: ignore[attr-defined]
    agent.internal_errors_by_component = {"server": 2, "gpu": 1}  # type: ignore[attr-defined]
    agent.sink_errors["SlackSink"] = 4
    agent.dumps_captured = 5
    s = _samples(agent)
    assert _one(s, "rankwatch_alerts_sent_total", sink="slack") == 3
    assert _one(s, "rankwatch_alerts_failed_total", sink="slack") == 2
    assert _one(s, "rankwatch_alerts_dropped_total", sink="slack") == 1
    assert _one(s, "rankwatch_internal_errors_total", component="server") == 2
    assert _one(s, "rankwatch_internal_errors_total", component="gpu") == 1
    assert _one(s, "rankwatch_internal_errors_total", component="sink") == 4
    assert _one(s, "rankwatch_dumps_captured_total") == 5
    assert _one(s, "rankwatch_world_size") == 2


@pytest.mark.unit
def test_a_failing_concern_leaves_the_rest_of_the_scrape(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = _agent(tmp_path)
    w = agent.watchers[0]
    _steps(w, 10, t0=time.time())
    w.attach(1)  # pid 1 exists; sample replaced below by something that breaks the collector
    w.last_sample = object()  # type: ignore[assignment]
    with caplog.at_level("DEBUG", logger="rankwatch"):
        s = _samples(agent)
        assert _one(s, "rankwatch_step") == 10
        assert _one(s, "rankwatch_internal_errors_total", component="exporter") == 1
        assert "rankwatch_process_up" not in s
        assert _one(s, "rankwatch_collector_success", collector="process") == 0
        assert _one(s, "rankwatch_collector_success", collector="training") == 1
        s = _samples(agent)  # fails again: counted, not logged again
        assert _one(s, "rankwatch_internal_errors_total", component="exporter") == 2
    said = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(said) == 1 and "process" in said[0].getMessage()
    assert "AttributeError" in (caplog.text or "")  # the cause is in the traceback


@pytest.mark.unit
def test_collectors_report_their_own_success_and_duration(tmp_path: Path) -> None:
    from rankwatch.exporter import registered

    agent = _agent(tmp_path)
    _steps(agent.watchers[0], 10, t0=time.time())
    s = _samples(agent)
    ran = {x.labels["collector"]: x.value for x in s["rankwatch_collector_success"]}
    # gpu, checkpoints, config and kubernetes apply only where that monitoring is on.
    assert ran == dict.fromkeys(("findings", "logs", "loop", "process", "training", "agent"), 1.0)
    took = {x.labels["collector"]: x.value for x in s["rankwatch_collector_duration_seconds"]}
    assert set(took) == set(ran) and all(0 <= v < 5 for v in took.values())
    assert all(x.labels["run"] == "t" and x.labels["rank"] == "0" for x in s["rankwatch_collector_success"])
    names = [r.name for r in registered()]
    assert names[-1] == "agent"  # runs last: it exports the others' failures
    assert set(names) == set(ran) | {"gpu", "checkpoints", "config", "kubernetes"}


@pytest.mark.unit
def test_a_new_collector_is_one_registered_function(tmp_path: Path) -> None:
    from prometheus_client.core import GaugeMetricFamily

    from rankwatch.exporter import collector, make_registry
    from rankwatch.snapshot import RANK_LABELS as LABELS
    from rankwatch.snapshot import AgentSnapshot

    @collector.register("answer", component="demo")
    def answer(snap: AgentSnapshot, failures: object) -> list[GaugeMetricFamily]:
        g = GaugeMetricFamily("rankwatch_answer", "A demo", labels=LABELS)
        g.add_metric(list(snap.labels), 42)
        return [g]

    try:
        agent = _agent(tmp_path)
        text = render(agent, make_registry(agent, process=False)).decode()
    finally:
        del collector._REGISTERED["answer"]
    assert 'rankwatch_answer{local_rank="0",node="n1",rank="0",run="t"} 42.0' in text
    assert (
        'rankwatch_collector_success{collector="answer",local_rank="0",node="n1",rank="0",run="t"} 1.0'
        in text
    )


@pytest.mark.unit
def test_a_failing_gpu_read_is_the_gpu_collectors_failure(tmp_path: Path) -> None:
    agent = _agent(tmp_path)

    def broken() -> Any:
        raise RuntimeError("NVML went away")

    agent.gpu_latest = broken
    s = _samples(agent)
    assert _one(s, "rankwatch_collector_success", collector="gpu") == 0
    assert _one(s, "rankwatch_internal_errors_total", component="gpu") == 1
    assert _one(s, "rankwatch_collector_success", collector="training") == 1


def _counted_components() -> dict[str, str]:
    """Every literal component name the agent counts an internal error under, read from its
    source: ``errors["x"]``-style counters, ``component="x"`` arguments and defaults, and
    Services' ``_failed("x", ...)``; name -> where."""
    import ast

    import rankwatch
    from conftest import source_nodes

    root = Path(rankwatch.__file__).parent
    counters = ("errors", "errs", "errors_by_component", "internal_errors_by_component")
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        where = str(path.relative_to(root))
        for node in source_nodes(path):
            names: list[ast.expr] = []
            if isinstance(node, ast.Subscript):
                v = node.value
                base = v.attr if isinstance(v, ast.Attribute) else v.id if isinstance(v, ast.Name) else ""
                if base in counters:
                    names.append(node.slice)
            elif isinstance(node, ast.Call):
                names += [kw.value for kw in node.keywords if kw.arg == "component"]
                f = node.func
                if where == "runtime/services.py" and isinstance(f, ast.Attribute) and f.attr == "_failed":
                    names += node.args[:1]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pos = [*a.posonlyargs, *a.args]
                pairs = [
                    *zip(pos[len(pos) - len(a.defaults) :], a.defaults, strict=True),
                    *zip(a.kwonlyargs, a.kw_defaults, strict=True),
                ]
                names += [d for arg, d in pairs if arg.arg == "component" and d is not None]
            for n in names:
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    found.setdefault(n.value, where)
    return found


@pytest.mark.unit
def test_every_component_an_error_is_counted_under_is_exported_from_zero() -> None:
    """``increase(rankwatch_internal_errors_total[15m]) > 0`` (the deploy rule) never sees the
    first error of a series born at 1: each name counted under must be listed from the start."""
    from rankwatch.exporter.health import COMPONENTS

    found = _counted_components()
    assert {"dumps", "alerts", "process", "signals", "hold"} <= set(found), found  # the scan works
    missing = {name: where for name, where in found.items() if name not in COMPONENTS}
    assert not missing, f"counted but not exported from 0 (add to exporter/health.py COMPONENTS): {missing}"


@pytest.mark.unit
def test_a_polled_source_is_exported_from_zero_under_its_name(tmp_path: Path) -> None:
    from rankwatch.runtime.services import Services

    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    agent = Agent(cfg, IDENT)

    async def go() -> str:
        svc = Services(agent, cfg, server=False)
        svc._start_polled()
        try:
            return render(agent).decode()
        finally:
            for t in svc._tasks:
                t.cancel()
            await asyncio.gather(*svc._tasks, return_exceptions=True)

    text = asyncio.run(go())
    assert agent.internal_errors_by_component.get("disk") == 0
    assert re.search(r'rankwatch_internal_errors_total\{[^}]*component="disk"[^}]*\} 0', text), text[-2000:]


@pytest.mark.unit
def test_exporter_and_server_import_no_runtime_module() -> None:
    """They read the snapshot (rankwatch.snapshot), never the agent's internals."""
    import ast

    import rankwatch
    from conftest import source_nodes

    root = Path(rankwatch.__file__).parent
    bad = []
    for path in sorted([*root.glob("exporter/*.py"), *root.glob("server/*.py")]):
        for node in source_nodes(path):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad += [f"{path.name}: {n}" for n in names if n.startswith("rankwatch.runtime")]
    assert bad == []


@pytest.mark.unit
def test_a_snapshot_is_immutable_and_stays_as_taken(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    w = agent.watchers[0]
    _steps(w, 10, t0=time.time() - 10)
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "no progress"))
    snap = agent.snapshot()
    _steps(w, 5, t0=time.time(), start=11)
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "progress resumed", resolved=True))
    agent.internal_errors_by_component["dumps"] = 3
    later = agent.snapshot()
    (rank,) = snap.ranks
    assert rank.state is not None and rank.state.last_step == 10 and len(rank.recent_steps) == 10
    assert [f.kind for f in snap.findings.active] == ["stall"] and len(snap.findings.recent) == 1
    assert snap.internal_errors.get("dumps", 0) == 0
    assert later.ranks[0].state is not None and later.ranks[0].state.last_step == 15
    assert later.findings.active == () and later.internal_errors["dumps"] == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.ranks = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        rank.latest["loss"] = 0.0  # type: ignore[index]


def _eight_ranks(tmp_path: Path) -> Agent:
    agent = _agent(tmp_path, ranks=8)
    now = time.time()
    for r, w in enumerate(agent.watchers):
        _steps(w, 300, t0=now - 200, samples_per_s=64.0, loss_scale=65536.0, mfu=0.4)
        w._records([EvalRecord(eval_loss=2.5 + r / 100, time=now)])
    agent.watchers[3]._records([StepRecord(step=301, loss=math.nan, time=now)])
    agent.emit(Finding("stall", Severity.CRITICAL, 5, "no progress"))
    agent.emit(Finding("throughput_drop", Severity.WARNING, 2, "slow"))
    agent.alert_stats = {"slack": {"sent": 2, "failed": 0, "dropped": 0}}  # type: ignore[attr-defined]
    return agent


@pytest.mark.tool
def test_promtool_check_metrics_is_clean_on_eight_ranks(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'); CI installs it")
    agent = _eight_ranks(tmp_path)
    body = render(agent)
    assert body.count(b"rankwatch_step{") == 8
    res = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=30, check=False
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == b"" and res.stderr.strip() == b""


@pytest.mark.unit
def test_openmetrics_exposition_parses(tmp_path: Path) -> None:
    agent = _eight_ranks(tmp_path)
    text = om_generate(make_registry(agent)).decode()
    fams = {f.name: f for f in om_parse(text)}
    assert fams["rankwatch_findings"].type == "counter"
    assert fams["rankwatch_build"].type == "info"
    assert any(math.isnan(s.value) for s in fams["rankwatch_loss"].samples)


@pytest.mark.unit
def test_step_time_histogram_counts_every_printed_step_time(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    _steps(agent.watchers[0], 120, t0=time.time() - 60)  # each printed 0.5 s
    slow = [StepRecord(step=i, step_time_s=7.0, time=time.time()) for i in (121, 122, 123)]
    agent.watchers[0]._records(slow)
    s = _samples(agent)
    assert _one(s, "rankwatch_step_time_seconds_count") == 123
    assert _one(s, "rankwatch_step_time_seconds_sum") == pytest.approx(120 * 0.5 + 3 * 7.0)
    assert _one(s, "rankwatch_step_time_seconds_bucket", le="0.5") == 120
    assert _one(s, "rankwatch_step_time_seconds_bucket", le="5") == 120
    assert _one(s, "rankwatch_step_time_seconds_bucket", le="10") == 123
    assert _one(s, "rankwatch_step_time_seconds_bucket", le="+Inf") == 123


@pytest.mark.unit
def test_a_broken_loop_monitor_loses_only_the_loop_series(tmp_path: Path) -> None:
    class Broken:
        lag = 0.0

        def health(self) -> tuple[bool, str]:
            raise RuntimeError("no clock")

    agent = _agent(tmp_path)
    agent.loop_monitor = Broken()
    s = _samples(agent)
    assert _one(s, "rankwatch_collector_success", collector="loop") == 0
    assert _one(s, "rankwatch_collector_success", collector="training") == 1
    assert "loop" in agent.snapshot().broken
