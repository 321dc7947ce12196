"""The bundled Grafana dashboards: static checks, then every panel query through a real
Prometheus that scrapes real agents watching a simulated four-rank run.

There is no Grafana server here, so the test does what Grafana would: substitute the
template variables and send each target's PromQL to Prometheus's query API.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port, wait_for
from gpufake import FakeBackend, healthy, xid
from rankwatch.config.schema import Config
from rankwatch.config.snapshot import replaced
from rankwatch.exporter import render
from rankwatch.exporter.checkpoints import _GAUGES as CHECKPOINT_GAUGES
from rankwatch.gpu.sampler import GpuSampler
from rankwatch.identity import Identity
from rankwatch.records import EvalRecord, Finding, Severity, StepRecord
from rankwatch.runtime.agent import Agent

ROOT = Path(__file__).resolve().parent.parent
GRAFANA = ROOT / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
UIDS = {"rankwatch-run", "rankwatch-rank", "rankwatch-gpu"}
VARIABLES = {"datasource", "run", "node", "rank"}
GRAFANA_VARS = {"__rate_interval", "__interval", "__range", "__range_s", "__all"}


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def _targets(dash: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for p in _panels(dash):
        for t in p.get("targets", []):
            yield p, t


def _builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboards", GRAFANA / "build_dashboards.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- what rankwatch exports, from a real exposition -------------------------------------------
def _exported_names(tmp_path: Path) -> set[str]:
    """Series names of a fully populated agent: every printed value, a finding, alert
    stats, the process, fake NVML GPUs (one with an Xid) and a checkpoint snapshot."""
    cfg = replaced(Config(), {"dumps.dir": str(tmp_path / "dumps")})
    ident = Identity(run="t", rank=0, local_rank=0, world_size=2, node="n1", job_end=time.time() + 3600)
    agent = Agent(cfg, ident)
    w = agent.add_watcher([tmp_path / "rank-0.log"], ident)
    t0 = time.time() - 100
    recs = [
        StepRecord(
            step=i,
            total_steps=1000,
            loss=3.0,
            grad_norm=0.5,
            learning_rate=1e-4,
            loss_scale=65536.0,
            tokens_per_s=1e5,
            samples_per_s=50.0,
            step_time_s=0.5,
            tflops=300.0,
            mfu=0.4,
            memory_bytes=3e10,
            max_memory_bytes=4e10,
            time=t0 + i,
        )
        for i in range(1, 60)
    ]
    w._records(recs)
    w._records([EvalRecord(eval_loss=2.9, step=59, time=t0 + 59)])
    agent.emit(Finding("stall", Severity.CRITICAL, 0, "no progress"))
    agent.alert_stats = {"slack": {"sent": 1, "failed": 0, "dropped": 0}}
    w.attach(os.getpid())
    fb = FakeBackend([healthy(0), xid(1, 79, at=0)])
    sampler = GpuSampler(backend=fb)

    async def sample() -> None:
        await w.sample_once()

    assert sampler.open()
    sampler.sample()

    asyncio.run(sample())
    snap: dict[str, Any] = {key: 1.0 for _, _, key in CHECKPOINT_GAUGES}
    snap.update(dir_exists=True, writing=False, checkpoints={"good": 2}, scans_total=3, errors_total=0)
    agent.gpu_latest = lambda: ({0: sampler.latest()}, True)
    agent.faces.checkpoints = lambda: snap
    text = render(agent).decode()
    names = {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}
    for must in (
        "rankwatch_gpu_xid_errors_total",
        "rankwatch_checkpoint_last_good_step",
        "rankwatch_mfu_ratio",
    ):
        assert must in names
    # A sidecar that could not start (watch --fail-open) exports only its degraded gauge.
    from rankwatch.runtime.failopen import metrics_text

    fail_open = metrics_text("config_error", ident.labels())
    return names | {s.name for fam in text_string_to_metric_families(fail_open) for s in fam.samples}


_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Identifiers in metric-name position: strings, label matchers, ranges, grouping
    clauses, function names, keywords and numbers taken out."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][\w:]*", s):
        word = m.group(0)
        if re.match(r"\s*\(", s[m.end() :]) or word.lower() in _KEYWORDS:
            continue
        if s[max(0, m.start() - 1)].isdigit():  # 1e5, 0.5
            continue
        names.add(word)
    return names


@pytest.mark.unit
def test_metric_name_extraction() -> None:
    expr = (
        'sum by (kind) (increase(rankwatch_findings_total{run=~"$run", kind!~"a|b"}[$__rate_interval]))'
        " / on (run) group_left () max(rankwatch_step) > 1.25 * quantile(0.5, up) or vector(0)"
    )
    assert metric_names(expr) == {"rankwatch_findings_total", "rankwatch_step", "up"}


# --- static checks ----------------------------------------------------------------------------
@pytest.mark.process
def test_dashboards_are_generated_and_in_sync() -> None:
    mod = _builder()
    expected = mod.expected_files()
    assert {p.name for p in expected if p.suffix == ".json"} == {p.name for p in DASHBOARDS}
    for path, text in expected.items():
        assert path.read_text() == text, f"{path} is stale: run python grafana/build_dashboards.py"
    res = subprocess.run(
        [sys.executable, str(GRAFANA / "build_dashboards.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.unit
def test_configmap_carries_every_dashboard_for_the_grafana_sidecar() -> None:
    cm = yaml.safe_load((GRAFANA / "kubernetes" / "dashboards-configmap.yaml").read_text())
    assert cm["apiVersion"] == "v1" and cm["kind"] == "ConfigMap"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(cm["data"]) == {p.name for p in DASHBOARDS}
    for p in DASHBOARDS:
        assert json.loads(cm["data"][p.name]) == _load(p)
    assert len(json.dumps(cm)) < 256 * 1024  # kubectl apply's last-applied annotation


@pytest.mark.unit
def test_provisioning_files() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "rankwatch.yaml").read_text())
    assert ds["apiVersion"] == 1 and ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rankwatch.yaml").read_text())
    assert prov["apiVersion"] == 1 and prov["providers"][0]["type"] == "file"


@pytest.mark.unit
def test_dashboard_structure_uids_variables_and_datasource() -> None:
    assert {_load(p)["uid"] for p in DASHBOARDS} == UIDS
    for path in DASHBOARDS:
        d = _load(path)
        assert path.stem == d["uid"], "file name follows the uid"
        assert d["schemaVersion"] >= 39 and "rankwatch" in d["tags"] and d["title"]
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert set(variables) == VARIABLES, path.name
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for name in ("run", "node", "rank"):
            v = variables[name]
            assert v["type"] == "query" and v["datasource"]["uid"] == "${datasource}"
            assert v["definition"].startswith("label_values(") and f", {name})" in v["definition"]
        ids = [p["id"] for p in _panels(d)]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        n = 0
        for panel in _panels(d):
            assert "gridPos" in panel
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]
            for t in panel["targets"]:
                n += 1
                assert t["datasource"]["uid"] == "${datasource}", panel["title"]
                used = set(re.findall(r"\$(\w+)", t["expr"]))
                assert used <= VARIABLES | GRAFANA_VARS, (panel["title"], used)
                assert "job=" not in t["expr"].replace('job=~"rankwatch', ""), "job is Prometheus's label"
        assert n >= 10, path.name
        for ann in d["annotations"]["list"]:
            if ann.get("builtIn"):
                continue
            assert ann["datasource"]["uid"] == "${datasource}" and ann["expr"]


@pytest.mark.unit
def test_run_overview_keeps_the_alert_link_working() -> None:
    d = _load(GRAFANA / "dashboards" / "rankwatch-run.json")
    assert d["uid"] == "rankwatch-run"  # README: /d/rankwatch-run?var-run={run}&var-rank={rank}
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"run", "rank"} <= names
    titles = " ".join(p.get("title", "") for p in _panels(d)).lower()
    for word in ("step rate", "loss", "eval loss", "grad norm", "learning rate", "tokens", "mfu"):
        assert word in titles, word
    for word in ("since progress", "active findings", "checkpoints", "dumps"):
        assert word in titles, word


@pytest.mark.unit
def test_every_metric_in_the_dashboards_is_exported(tmp_path: Path) -> None:
    exported = _exported_names(tmp_path) | {"up"}
    for path in DASHBOARDS:
        d = _load(path)
        exprs = [t["expr"] for _, t in _targets(d)]
        exprs += [a["expr"] for a in d["annotations"]["list"] if a.get("expr")]
        for v in d["templating"]["list"]:
            if v.get("definition"):
                m = re.fullmatch(r"label_values\((.+), \w+\)", v["definition"])
                assert m, v["definition"]
                exprs.append(m.group(1))
        for expr in exprs:
            unknown = metric_names(expr) - exported
            assert not unknown, f"{path.name}: {expr!r} uses {unknown}, not exported by rankwatch"


# --- the real thing: agents -> Prometheus -> every panel query ----------------------------------
FAKE_GPU_AGENT = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})  # tests/: the scripted GPU backend
import rankwatch.runtime.services as services
from gpufake import FakeBackend, healthy, xid

_init = services.Services.__init__

def init(self, *args, **kw):
    kw.setdefault("gpu_backend", FakeBackend([healthy(0), xid(1, 79, at=0)]))
    _init(self, *args, **kw)

services.Services.__init__ = init
from rankwatch.cli import main
sys.exit(main(sys.argv[1:]))
"""

RUN = "gtest"


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except Exception as e:
        return {"status": "error", "error": str(e)}


def _substitute(expr: str) -> str:
    for name, value in (
        ("__rate_interval", "5s"),
        ("__interval", "2s"),
        ("__range_s", "60"),
        ("__range", "1m"),
        ("run", RUN),
        ("node", ".*"),
        ("rank", ".*"),  # "All"; on the rank dashboard: any rank, as a regex
    ):
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in expr, expr
    return expr


def _agent_config(path: Path, node: str, *, gpu: bool, extra: str = "") -> Path:
    path.write_text(
        f"run: {{name: {RUN}, node: {node}, world_size: 4}}\n"
        "detectors: {warmup_steps: 20}\n"
        "stall: {startup_grace: 60s, floor: 30s}\n"
        "process: {sample_interval: 200ms}\n"
        f"dumps: {{dir: {path.parent / 'dumps'}}}\n"
        "server: {listen: '127.0.0.1:0'}\n"
        f"gpu: {{enabled: {'true' if gpu else 'false'}, interval: 1s}}\n" + extra
    )
    return path


def _checkpoints(folder: Path) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir()
    old = time.time() - 600
    for step in (20, 40):
        f = folder / f"step_{step}.safetensors"
        save_file({"w": np.zeros(16, dtype=np.float32)}, str(f))
        os.utime(f, (old + step, old + step))
    return folder


@pytest.mark.tool
def test_every_panel_query_returns_data_from_a_real_prometheus(tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (Debian package prometheus)")
    logs = tmp_path / "logs"
    logs.mkdir()
    # Rank 0 prints like torchtitan (MFU, TFLOP/s, tokens/s), rank 1 like Megatron (LR, loss
    # scale, total steps), ranks 2-3 key=value (LR, tokens/s, eval loss): together every panel.
    formats = {0: "torchtitan", 1: "megatron", 2: "kv", 3: "kv"}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for r, fmt in formats.items():
            with open(logs / f"rank-{r}.log", "ab") as fh:
                cmd = [
                    sys.executable, "-m", "rankwatch.demo.trainer", "--rank", str(r), "--world-size", "4",
                    "--steps", "100000", "--step-time", "0.05", "--format", fmt, "--eval-every", "20",
                    "--fault", "spike@60:rank=0",
                ]  # fmt: skip
                env = dict(os.environ, RANK=str(r), WORLD_SIZE="4", PYTHONUNBUFFERED="1")
                procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env))
        # Agent 1 (node n1, the real CLI, no GPU) watches ranks 0-2; agent 2 (node n2, fake
        # NVML with an Xid on its second GPU, checkpoints) watches rank 3 alone.
        cfg1 = _agent_config(tmp_path / "a1.yaml", "n1", gpu=False)
        ckpt = _checkpoints(tmp_path / "ckpt")
        cfg2 = _agent_config(
            tmp_path / "a2.yaml",
            "n2",
            gpu=True,
            extra=f"checkpoints: {{dir: {ckpt}, settle: 200ms, poll_interval: 1s}}\n",
        )
        cfg2.write_text(cfg2.read_text().replace("world_size: 4}", "world_size: 4, rank: 3, local_rank: 0}"))
        a1 = [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg1)]
        for r in range(3):
            a1 += ["--pid", str(procs[r].pid), "--log", str(logs / f"rank-{r}.log")]
        a2 = [sys.executable, "-c", FAKE_GPU_AGENT, "-v", "watch", "--config", str(cfg2)]
        a2 += ["--pid", str(procs[3].pid), "--log", str(logs / "rank-3.log")]
        errs = []
        for i, cmd in enumerate((a1, a2)):
            err = tmp_path / f"agent{i}.err"
            with open(err, "wb") as fh:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh))
            errs.append(err)
        pattern = re.compile(r"serving metrics and API on [^\s]+:(\d+)")
        ports = [
            wait_for(
                lambda e=e: pattern.search(e.read_text(errors="replace")), 20, f"{e.name}: port", interval=0.2
            ).group(1)
            for e in errs
        ]
        prom_port = free_port()
        rules = ROOT / "deploy" / "prometheus" / "rankwatch.rules.yml"
        (tmp_path / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": [
                        {
                            "job_name": "rankwatch",
                            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
                        }
                    ],
                }
            )
        )
        with open(tmp_path / "prometheus.log", "wb") as fh:
            procs.append(
                subprocess.Popen(
                    [
                        prometheus,
                        f"--config.file={tmp_path / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}",
                    ],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                )
            )
        api = f"http://127.0.0.1:{prom_port}/api/v1/"

        def query(expr: str) -> dict[str, Any]:
            return _get(api + "query?" + urllib.parse.urlencode({"query": expr}))

        exprs: dict[str, tuple[str, str]] = {}
        annotations: dict[str, tuple[str, str]] = {}
        for path in DASHBOARDS:
            d = _load(path)
            for panel, t in _targets(d):
                exprs[_substitute(t["expr"])] = (path.stem, f"{panel['title']} / {t['refId']}")
            for a in d["annotations"]["list"]:
                if a.get("expr"):
                    annotations[_substitute(a["expr"])] = (path.stem, a["name"])

        missing: dict[str, Any] = {}

        def all_have_data() -> bool:
            missing.clear()
            for expr, where in exprs.items():
                res = query(expr)
                if res.get("status") != "success" or not res["data"]["result"]:
                    missing[expr] = (where, res.get("error") or "no data")
            return not missing

        try:
            wait_for(lambda: query("up").get("data", {}).get("result"), 20, "the first scrape", interval=0.2)
            wait_for(all_have_data, 25, "data in every panel", interval=0.2)
        except AssertionError:
            detail = "\n".join(f"{w}: {e} -> {why}" for e, (w, why) in missing.items())
            raise AssertionError(f"{len(missing)} of {len(exprs)} panel queries failed:\n{detail}") from None
        for expr, where in annotations.items():
            res = query(expr)
            assert res.get("status") == "success", (where, expr, res)
        # The template variables' label_values() queries, as Grafana runs them.
        for path in DASHBOARDS:
            for v in _load(path)["templating"]["list"]:
                if v["type"] != "query":
                    continue
                m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["definition"])
                assert m, v["definition"]
                url = f"{api}label/{m.group(2)}/values?" + urllib.parse.urlencode(
                    {"match[]": _substitute(m.group(1))}
                )
                values = set(_get(url).get("data") or [])
                want = {
                    "run": {RUN},
                    "node": {"n1", "n2"},
                    "rank": {"3"} if "gpu" in path.stem else {"0", "1", "2", "3"},
                }
                assert want[v["name"]] <= values, (path.name, v["name"], values)
        # The recording rules evaluate on live data too.
        for record in ("run:rankwatch_step:max", "run:rankwatch_step_duration_seconds:median"):
            wait_for(lambda r=record: query(r).get("data", {}).get("result"), 10, record, interval=0.2)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


@pytest.mark.unit
def test_every_metric_in_the_prometheus_rules_is_exported_or_recorded(tmp_path: Path) -> None:
    """A renamed metric must break CI here, not silently turn an alert into one that never fires."""
    exported = _exported_names(tmp_path) | {"up"}
    for path in (
        ROOT / "deploy" / "prometheus" / "rankwatch.rules.yml",
        ROOT / "helm" / "rankwatch" / "files" / "rankwatch.rules.yml",
    ):
        groups = yaml.safe_load(path.read_text())["groups"]
        rules = [r for g in groups for r in g["rules"]]
        recorded = {r["record"] for r in rules if "record" in r}
        assert rules and recorded
        for r in rules:
            unknown = metric_names(r["expr"]) - exported - recorded
            assert not unknown, f"{path.name}: {r.get('alert') or r.get('record')} uses {unknown}"
