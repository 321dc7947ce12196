"""The cross-rank Prometheus rules under deploy/prometheus, checked and unit-tested by promtool.

The unit tests are generated here (a run of 1,024 ranks is easier to write as a loop than
as YAML) and run against a copy of the rules without annotations: promtool compares
annotations exactly, and the behaviour under test is which alerts fire with which labels.
One case runs the real file with its annotations rendered.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rankwatch.rules.yml"
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    return path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=60)


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _rank(run: str, rank: int | str, node: str = "n1", instance: str = "n1:9478") -> dict[str, str]:
    return {
        "run": run,
        "rank": str(rank),
        "local_rank": str(rank),
        "node": node,
        "job": "rankwatch",
        "instance": instance,
    }


def _alert(alertname: str, at: str, *alerts: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alertname, "exp_alerts": [{"exp_labels": a} for a in alerts]}


def _silent(at: str, *names: str) -> list[dict[str, Any]]:
    return [_alert(n, at) for n in names]


def _write_tests(tmp_path: Path, rules: Path, tests: Iterable[dict[str, Any]]) -> Path:
    doc = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": list(tests)}
    path = tmp_path / "rules.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _stripped_rules(tmp_path: Path) -> Path:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _promtool_test(tmp_path: Path, tests: list[dict[str, Any]], rules: Path | None = None) -> None:
    test_file = _write_tests(tmp_path, rules or _stripped_rules(tmp_path), tests)
    res = _run("test", "rules", str(test_file))
    assert res.returncode == 0, res.stdout + res.stderr


ALL_ALERTS = (
    "RankwatchRankLagging",
    "RankwatchStraggler",
    "RankwatchRunStalled",
    "RankwatchAgentDown",
    "RankwatchNaNLoss",
    "RankwatchRankStalled",
    "RankwatchRankCrashed",
    "RankwatchNCCLFailure",
    "RankwatchGPUFault",
    "RankwatchCheckpointProblem",
    "RankwatchFinding",
    "RankwatchAgentDegraded",
    "RankwatchAlertsDropped",
    "RankwatchAgentErrors",
)
FINDING_ALERTS = (
    "RankwatchNaNLoss",
    "RankwatchRankStalled",
    "RankwatchRankCrashed",
    "RankwatchNCCLFailure",
    "RankwatchGPUFault",
    "RankwatchCheckpointProblem",
    "RankwatchFinding",
)


# --- static checks --------------------------------------------------------------------------
@pytest.mark.tool
def test_rules_file_passes_promtool_check() -> None:
    res = _run("check", "rules", str(RULES))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert {a["alert"] for a in alerts} == set(ALL_ALERTS)
    for a in alerts:
        assert {"summary", "description", "hint"} <= set(a["annotations"]), a["alert"]
        assert "job" not in a.get("labels", {})
        # Every alert names its severity: statically, or through the finding's own label.
        assert "severity" in a.get("labels", {}) or "rankwatch_active_findings" in a["expr"], a["alert"]


@pytest.mark.unit
def test_finding_rules_keep_the_agents_severity() -> None:
    """A rule built on the agent's findings must neither set a severity of its own (an info
    `ecc_error` would become a critical "drain the node") nor match info findings."""
    doc = yaml.safe_load(RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    finding_rules = [a for a in alerts if "rankwatch_active_findings" in a["expr"]]
    assert {a["alert"] for a in finding_rules} == set(FINDING_ALERTS)
    for a in finding_rules:
        assert "severity" not in a.get("labels", {}), a["alert"]
        assert 'severity=~"warning|critical"' in a["expr"], a["alert"]


@pytest.mark.tool
def test_example_prometheus_config_passes_promtool_check() -> None:
    res = _run("check", "config", str(CONFIG))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 1 rule files found" in res.stdout


# --- cross-rank alerts ------------------------------------------------------------------------
@pytest.mark.tool
def test_rank_lagging_fires_for_the_lagging_rank_only(tmp_path: Path) -> None:
    series = [_series("rankwatch_step", "0+20x30", **_rank("lag", r)) for r in range(3)]
    series.append(_series("rankwatch_step", "0+20x5 100x25", **_rank("lag", 3)))
    series += [_series("rankwatch_step_duration_seconds", "3+0x30", **_rank("lag", r)) for r in range(4)]
    series += [_series("rankwatch_step", "0+20x30", **_rank("ok", r, node="n2")) for r in range(4)]
    lagging = {**_rank("lag", 3), "severity": "warning"}
    tests = [
        _alert("RankwatchRankLagging", "12m"),  # 120 behind since 11m: pending, not firing yet
        _alert("RankwatchRankLagging", "20m", lagging),
        *_silent("20m", "RankwatchStraggler", "RankwatchRunStalled", "RankwatchAgentDown"),
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": tests}])


@pytest.mark.tool
def test_rank_lagging_annotations_render_from_the_real_rules(tmp_path: Path) -> None:
    series = [_series("rankwatch_step", "0+20x30", **_rank("lag", r)) for r in range(3)]
    series.append(_series("rankwatch_step", "0+20x5 100x25", **_rank("lag", 3)))
    labels = {**_rank("lag", 3), "severity": "warning"}
    doc = yaml.safe_load(RULES.read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "RankwatchRankLagging")

    def render(text: str) -> str:
        for k, v in labels.items():
            text = text.replace(f"{{{{ $labels.{k} }}}}", v)
        return text.replace("{{ $value }}", "100")

    expected = {k: render(v) for k, v in rule["annotations"].items()}
    assert all("{{" not in v for v in expected.values()), expected
    test = {
        "eval_time": "20m",
        "alertname": "RankwatchRankLagging",
        "exp_alerts": [{"exp_labels": labels, "exp_annotations": expected}],
    }
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": [test]}], RULES)


@pytest.mark.tool
def test_straggler_needs_a_sustained_slow_rank_in_a_run_of_three_or_more(tmp_path: Path) -> None:
    series = []
    for r in range(4):
        series.append(_series("rankwatch_step", "0+20x30", **_rank("slow", r)))
        series.append(
            _series("rankwatch_step_duration_seconds", "2+0x30" if r == 1 else "1+0x30", **_rank("slow", r))
        )
    # Two ranks: the median is their mean, so "1.25x the median" says nothing; never alerts.
    for r in range(2):
        series.append(_series("rankwatch_step", "0+20x30", **_rank("pair", r)))
        series.append(
            _series("rankwatch_step_duration_seconds", "3+0x30" if r else "1+0x30", **_rank("pair", r))
        )
    # A single slow minute (a checkpoint save) stays below the 10 minute window.
    for r in range(4):
        values = "1x8 5 1x20" if r == 2 else "1+0x30"
        series.append(_series("rankwatch_step_duration_seconds", values, **_rank("blip", r)))
    tests = [
        _alert("RankwatchStraggler", "5m"),
        _alert("RankwatchStraggler", "15m", {**_rank("slow", 1), "severity": "warning"}),
        _alert("RankwatchRankLagging", "15m"),
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": tests}])


@pytest.mark.tool
def test_run_stalled_only_when_every_live_rank_is_past_its_timeout(tmp_path: Path) -> None:
    series = []
    for run, sick in (("hung", {0, 1, 2}), ("partial", {0, 1}), ("done", {0, 1, 2})):
        for r in range(3):
            labels = _rank(run, r)
            series.append(
                _series("rankwatch_seconds_since_progress", "0+60x30" if r in sick else "5+0x30", **labels)
            )
            series.append(_series("rankwatch_stall_timeout_seconds", "120+0x30", **labels))
            series.append(_series("rankwatch_process_up", "0+0x30" if run == "done" else "1+0x30", **labels))
    tests = [
        _alert("RankwatchRunStalled", "4m"),
        _alert("RankwatchRunStalled", "10m", {"run": "hung", "rank": "all", "severity": "critical"}),
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": tests}])


@pytest.mark.tool
def test_agent_down_while_its_run_goes_on(tmp_path: Path) -> None:
    def agent(run: str, rank: int, node: str, up: str, start: str) -> list[dict[str, str]]:
        inst = f"{node}:9478"
        return [
            _series("up", up, job="rankwatch", instance=inst),
            _series(
                "rankwatch_agent_start_time_seconds", start, **_rank(run, rank, node=node, instance=inst)
            ),
        ]

    series = [
        *agent("ad", 0, "na", "1+0x30", "1000+0x30"),
        *agent("ad", 1, "nb", "1x5 0x25", "1000x5 stale"),
        # The only agent of a run went away: the job ended (or the node with it); not this alert.
        *agent("gone", 0, "nc", "1x5 0x25", "2000x5 stale"),
    ]
    down = {
        "job": "rankwatch",
        "instance": "nb:9478",
        "run": "ad",
        "rank": "1",
        "node": "nb",
        "severity": "warning",
    }
    tests = [
        _alert("RankwatchAgentDown", "7m"),
        _alert("RankwatchAgentDown", "15m", down),
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": tests}])


# --- per-agent findings ---------------------------------------------------------------------
@pytest.mark.tool
def test_finding_alerts_follow_the_active_findings(tmp_path: Path) -> None:
    def finding(
        rank: int | str, kind: str, severity: str, values: str
    ) -> tuple[dict[str, str], dict[str, str]]:
        labels = {**_rank("f", rank), "kind": kind, "severity": severity}
        return labels, _series("rankwatch_active_findings", values, **labels)

    cases = {
        "nan": finding(0, "nan_loss", "critical", "0x2 1x30"),
        "nan_resolved": finding(1, "nan_loss", "critical", "1x2 0x30"),
        "stall": finding(2, "stall", "critical", "1x30"),
        "crash": finding(3, "crash", "critical", "1x2 stale"),  # the agent exited with its rank
        "nccl": finding(0, "nccl_timeout", "critical", "1x30"),
        "xid": finding(1, "xid", "critical", "1x30"),
        "ckpt": finding("", "checkpoint_stale", "warning", "1x30"),
        "spike": finding(2, "loss_spike", "warning", "1x30"),
        "info": finding(3, "grad_clipping_saturated", "info", "1x30"),
    }
    series = [s for _, s in cases.values()]
    series += [
        _series("rankwatch_alerts_dropped_total", "0 0 1+0x30", **_rank("f", 0), sink="slack"),
        _series("rankwatch_alerts_dropped_total", "0+0x30", **_rank("f", 0), sink="webhook"),
        _series("rankwatch_internal_errors_total", "0x5 1+0x30", **_rank("f", 0), component="parser"),
        _series("rankwatch_internal_errors_total", "0+0x30", **_rank("f", 0), component="sink"),
    ]

    def labels(key: str, severity: str | None = None) -> dict[str, str]:
        got = {k: v for k, v in cases[key][0].items() if v}  # Prometheus drops empty labels
        if severity:
            got["severity"] = severity
        return got

    tests = [
        _alert("RankwatchNaNLoss", "1m", labels("nan_resolved")),
        _alert("RankwatchNaNLoss", "5m", labels("nan")),
        _alert("RankwatchRankStalled", "5m", labels("stall")),
        _alert("RankwatchRankCrashed", "5m", labels("crash")),
        _alert("RankwatchRankCrashed", "20m"),  # gone for longer than the 10 minute memory
        _alert("RankwatchNCCLFailure", "5m", labels("nccl")),
        _alert("RankwatchGPUFault", "5m", labels("xid")),
        _alert("RankwatchCheckpointProblem", "5m", labels("ckpt")),
        _alert("RankwatchFinding", "5m", labels("spike")),
        _alert("RankwatchAlertsDropped", "5m", {**_rank("f", 0), "sink": "slack", "severity": "warning"}),
        _alert("RankwatchAlertsDropped", "30m"),
        _alert("RankwatchAgentErrors", "8m", {**_rank("f", 0), "component": "parser", "severity": "info"}),
        _alert("RankwatchAgentErrors", "30m"),
        *_silent(
            "5m", "RankwatchRankLagging", "RankwatchStraggler", "RankwatchRunStalled", "RankwatchAgentDown"
        ),
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": tests}])


# --- scale ------------------------------------------------------------------------------------
@pytest.mark.tool
def test_a_run_of_1024_ranks_names_only_the_lagging_rank_and_the_straggler(tmp_path: Path) -> None:
    lagging, straggler = 777, 311
    series = []
    for r in range(1024):
        node = f"gpu-{r // 8:03d}"
        labels = _rank("big", r, node=node, instance=f"{node}:{9478 + r % 8}")
        labels["local_rank"] = str(r % 8)
        series.append(_series("rankwatch_step", "0+20x5 100x25" if r == lagging else "0+20x30", **labels))
        series.append(
            _series("rankwatch_step_duration_seconds", "4+0x30" if r == straggler else "3+0x30", **labels)
        )
        series.append(_series("rankwatch_seconds_since_progress", "1+0x30", **labels))
        series.append(_series("rankwatch_stall_timeout_seconds", "120+0x30", **labels))

    def alert(r: int) -> dict[str, str]:
        node = f"gpu-{r // 8:03d}"
        return {**_rank("big", r, node=node, instance=f"{node}:{9478 + r % 8}"), "local_rank": str(r % 8)}

    tests = [
        _alert("RankwatchRankLagging", "20m", {**alert(lagging), "severity": "warning"}),
        _alert("RankwatchStraggler", "20m", {**alert(straggler), "severity": "warning"}),
        *_silent("20m", "RankwatchRunStalled", "RankwatchAgentDown"),
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": tests}])


@pytest.mark.tool
def test_finding_alerts_carry_the_agents_severity_and_skip_info(tmp_path: Path) -> None:
    """One info, one warning and one critical finding of a kind each finding rule covers: the
    info one fires nothing, the others fire with the agent's severity (never overwritten)."""
    kinds = {
        "RankwatchNaNLoss": "nan_loss",
        "RankwatchRankStalled": "stall",
        "RankwatchRankCrashed": "oom",
        "RankwatchNCCLFailure": "nccl_error",
        "RankwatchGPUFault": "ecc_error",
        "RankwatchCheckpointProblem": "checkpoint_corrupt",
        "RankwatchFinding": "throughput_drop",
    }
    assert set(kinds) == set(FINDING_ALERTS)
    series = []
    tests = []
    for alert, kind in kinds.items():
        run = kind.replace("_", "-")
        fired = []
        for rank, severity in enumerate(("info", "warning", "critical")):
            labels = {**_rank(run, rank), "kind": kind, "severity": severity}
            series.append(_series("rankwatch_active_findings", "1x30", **labels))
            if severity != "info":
                fired.append(labels)
        # promtool wants every firing alert of the name at that time, across all runs.
        tests.append(_alert(alert, "5m", *fired))
    # The info-only GPU fault of the issue: an ECC history note never pages anyone.
    info_only = [
        _series("rankwatch_active_findings", "1x30", **{**_rank("quiet", 0), "kind": k, "severity": "info"})
        for k in ("ecc_error", "xid", "checkpoint_stale", "disk_low", "loss_plateau", "nan_loss")
    ]
    _promtool_test(
        tmp_path,
        [
            {"interval": "1m", "input_series": series, "alert_rule_test": tests},
            {
                "interval": "1m",
                "input_series": info_only,
                "alert_rule_test": _silent("5m", *FINDING_ALERTS),
            },
        ],
    )


@pytest.mark.tool
def test_agent_degraded_fires_while_a_fail_open_agent_watches_nothing(tmp_path: Path) -> None:
    from rankwatch.runtime.failopen import metrics_text

    # The series the fail-open agent really exports, as Prometheus would store it.
    line = next(
        ln
        for ln in metrics_text("config_error", {"run": "d", "rank": "0"}).splitlines()
        if ln.startswith("rankwatch_agent_degraded{")
    )
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    labels.update(job="rankwatch", instance="n1:9478")
    series = [_series("rankwatch_agent_degraded", "1x5 stale", **labels)]
    tests = [
        _alert("RankwatchAgentDegraded", "2m", {**labels, "severity": "warning"}),
        _alert("RankwatchAgentDegraded", "15m"),  # the pod was fixed and restarted
    ]
    _promtool_test(tmp_path, [{"interval": "1m", "input_series": series, "alert_rule_test": tests}])
