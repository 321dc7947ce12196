"""Plugin settings beside their code (config/settings.py): a sink's section is declared in its
module and assembled into the schema, with its keys, defaults, docs and checks unchanged."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import pickle
import re
from pathlib import Path

import pytest

from rankwatch.actions.alerts.alertmanager import AlertmanagerConfig
from rankwatch.actions.alerts.slack import SlackConfig
from rankwatch.actions.alerts.webhook import WebhookConfig
from rankwatch.config import schema
from rankwatch.config.loader import ConfigError, config_from_yaml
from rankwatch.config.settings import assemble, plugin_settings, settings, settings_of
from rankwatch.detectors.loss import LossSpikeConfig

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parent.parent / "agent" / "rankwatch"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _import_time_imports(source: str, name: str, is_package: bool) -> set[str]:
    """The rankwatch modules ``source`` imports when it is imported: module-level statements,
    not function bodies and not ``if TYPE_CHECKING:`` blocks."""
    package = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                test = node.test
                if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
                    visit(node.orelse)
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                    visit(part)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.split(".")[0] == "rankwatch")
            elif isinstance(node, ast.ImportFrom):
                target = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                if target.split(".")[0] == "rankwatch":
                    out.add(target)
                    out.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES)

    visit(ast.parse(source).body)
    # importing a.b.c runs a and a.b first
    return {".".join(m.split(".")[:i]) for m in out for i in range(1, m.count(".") + 2)}


def _reaches_schema(start: str, source: str | None = None) -> list[str] | None:
    """The import chain from ``start`` to rankwatch.config.schema at import time, or None."""
    seen = {start}
    todo: list[tuple[str, list[str]]] = [(start, [start])]
    while todo:
        mod, chain = todo.pop()
        path = MODULES[mod] if source is None or mod != start else None
        text = path.read_text() if path is not None else source
        assert text is not None
        is_package = path is not None and path.name == "__init__.py"
        for dep in sorted(_import_time_imports(text, mod, is_package)):
            if dep == "rankwatch.config.schema":
                return [*chain, dep]
            if dep in MODULES and dep not in seen:
                seen.add(dep)
                todo.append((dep, [*chain, dep]))
    return None


def _built_with_the_schema() -> list[str]:
    """The modules the schema's ``assemble(..., discover=...)`` calls import: every module of
    each family's package but those its loader leaves out (the sinks' ``MACHINERY``)."""
    tree = ast.parse((PACKAGE / "config" / "schema.py").read_text())
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "discover":
            assert isinstance(node.value, ast.Constant)
            loader = importlib.import_module(node.value.value)
            package = node.value.value.rpartition(".")[0]
            skip = {f"{package}.{m}" for m in getattr(loader, "MACHINERY", ())}
            out += [n for n in MODULES if n.rpartition(".")[0] == package and n not in skip]
    return sorted(out)


def test_a_module_with_settings_does_not_import_the_schema_while_it_loads() -> None:
    """The schema imports every module of the sink and detector packages while it is being
    built (their settings): one that imported the schema back at import time would find it
    half made, and one that declares settings after such an import would be left out."""
    built = _built_with_the_schema()
    declaring = [n for n in MODULES if re.search(r"^@settings\(", MODULES[n].read_text(), re.M)]
    assert {"rankwatch.actions.alerts.slack", "rankwatch.detectors.loss"} <= set(declaring)
    assert "rankwatch.detectors.gpu" in built
    assert set(declaring) <= set(built), sorted(set(declaring) - set(built))
    for name in built:
        assert _reaches_schema(name) is None, (name, _reaches_schema(name))


def test_the_rule_finds_a_runtime_import_of_the_schema() -> None:
    bad = (
        "from rankwatch.actions.alerts.message import AlertSink\nfrom rankwatch.config.schema import Config\n"
    )
    good = "if TYPE_CHECKING:\n    from rankwatch.config.schema import Config\n"
    via = "from rankwatch.identity import Identity\n"  # identity imports the schema
    assert _reaches_schema("rankwatch.actions.alerts.slack", bad) is not None
    assert _reaches_schema("rankwatch.actions.alerts.slack", good) is None
    assert _reaches_schema("rankwatch.actions.alerts.slack", via) == [
        "rankwatch.actions.alerts.slack",
        "rankwatch.identity",
        "rankwatch.config.schema",
    ]


def test_the_sinks_sections_are_assembled_into_alerts() -> None:
    fields = {f.name: f for f in dataclasses.fields(schema.AlertsConfig)}
    assert fields["slack"].metadata["doc"] == "Slack (slack-sdk)"
    assert fields["alertmanager"].metadata["doc"] == "Prometheus Alertmanager v2 API"
    assert fields["webhook"].metadata["doc"] == "generic JSON webhook"
    cfg = schema.Config()
    assert settings_of(cfg.alerts, SlackConfig) is cfg.alerts.slack == SlackConfig()
    assert settings_of(cfg.alerts, WebhookConfig).timeout == 10.0
    assert [p.key for p in plugin_settings("alerts")][:3] == ["alertmanager", "slack", "webhook"]
    detectors = {f.name: f.metadata["doc"] for f in dataclasses.fields(schema.DetectorsConfig)}
    assert detectors["nan"] == "NaN / Inf detection" and detectors["rank_lagging"] == "cross-rank lag"
    assert next(iter(detectors)) == "warmup_steps" and len(detectors) == 13
    assert settings_of(cfg.detectors, LossSpikeConfig).factor == 2.0 == cfg.detectors.loss_spike.factor
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # analyze -j sends it to worker processes


def test_settings_of_reads_a_plugin_section_from_the_whole_config_typed() -> None:
    from rankwatch.detectors.crossrank import RankLagConfig

    cfg = config_from_yaml(
        "alerts:\n  slack:\n    channel: '#ops'\ndetectors:\n  rank_lagging:\n    min_lag_steps: 4\n"
    )
    assert (
        settings_of(cfg, SlackConfig) is cfg.alerts.slack and settings_of(cfg, SlackConfig).channel == "#ops"
    )
    assert settings_of(cfg, RankLagConfig).min_lag_steps == 4
    assert settings_of(cfg.detectors, RankLagConfig) is settings_of(cfg, RankLagConfig)
    with pytest.raises(LookupError, match=r"holds no alerts\.slack"):
        settings_of(cfg.detectors, SlackConfig)
    with pytest.raises(LookupError, match="not registered"):
        settings_of(cfg, schema.GpuConfig)


def _plugin_attribute_reads(tree: ast.AST) -> list[str]:
    """``<x>.alerts.<key>`` / ``<x>.detectors.<key>`` for a plugin's key: untyped (``Any``) reads."""
    keys = {(p.parent, p.key) for p in plugin_settings()}
    out = []
    for node in ast.walk(tree):
        inner = node.value if isinstance(node, ast.Attribute) else None
        if isinstance(inner, ast.Attribute) and (inner.attr, node.attr) in keys:
            out.append(f"{inner.attr}.{node.attr} (line {node.lineno})")
    return out


def test_the_package_reads_plugin_sections_through_settings_of() -> None:
    """mypy sees ``cfg.alerts.slack`` as ``Any``: a typo there is found at run time only."""
    found = {
        name: reads
        for name, path in MODULES.items()
        if (reads := _plugin_attribute_reads(ast.parse(path.read_text(), str(path))))
    }
    assert found == {}
    planted = ast.parse("def f(cfg):\n    return cfg.alerts.slack.token, cfg.detectors.nan.enabled\n")
    assert _plugin_attribute_reads(planted) == ["alerts.slack (line 2)", "detectors.nan (line 2)"]


def test_credentials_are_the_keys_their_sections_mark() -> None:
    from rankwatch.config.loader import credentials

    known = credentials()
    assert known.secrets == {
        "server.token": "RANKWATCH_TOKEN",
        "server.metrics_token": "RANKWATCH_METRICS_TOKEN",
        "alerts.slack.token": "SLACK_BOT_TOKEN",
        "alerts.slack.webhook_url": "SLACK_WEBHOOK_URL",
    }
    assert set(known.urls) == {
        "alerts.grafana_url",
        "alerts.report_url",
        "alerts.alertmanager.urls",
        "alerts.alertmanager.names",
        "alerts.slack.base_url",
        "alerts.webhook.urls",
        "alerts.webhook.names",
    }
    assert known.headers == {"alerts.webhook.headers": "HOOK_TOKEN"}


def test_old_names_still_import_from_the_schema() -> None:
    from rankwatch.config.schema import AlertmanagerConfig as Am
    from rankwatch.config.schema import LossSpikeConfig as Spike
    from rankwatch.config.schema import SlackConfig as Slack

    assert Slack is SlackConfig and Am is AlertmanagerConfig and Spike is LossSpikeConfig
    with pytest.raises(AttributeError):
        schema.NoSuchConfig  # noqa: B018


def test_a_sinks_keys_load_and_are_checked_with_the_key_named() -> None:
    cfg = config_from_yaml("alerts:\n  webhook:\n    urls: [http://127.0.0.1:9/hook]\n    timeout: 2s\n")
    assert settings_of(cfg.alerts, WebhookConfig).urls == ("http://127.0.0.1:9/hook",)
    with pytest.raises(ConfigError, match=r"alerts\.slack\.token: a bot token needs alerts\.slack\.channel"):
        config_from_yaml("alerts:\n  slack:\n    token: xoxb-1\n")
    with pytest.raises(ConfigError, match=r"alerts\.alertmanager\.timeout"):
        config_from_yaml("alerts:\n  alertmanager:\n    timeout: 0s\n")
    with pytest.raises(ConfigError, match=r"detectors\.host_memory\.window: window of 600s"):
        config_from_yaml("detectors:\n  host_memory:\n    window: 10m\n    resolution: 2m\n")
    with pytest.raises(
        ConfigError, match=r"detectors\.loss_spike\.factr: unknown key \(did you mean 'factor'\?\)"
    ):
        config_from_yaml("detectors:\n  loss_spike:\n    factr: 3\n")


def test_a_section_is_declared_once_and_never_over_a_core_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from rankwatch.config import settings as module

    monkeypatch.setattr(module, "_REGISTRY", dict(module._REGISTRY))  # registrations here stay here

    @dataclasses.dataclass(frozen=True)
    class Other:
        x: int = 1

    with pytest.raises(TypeError, match=r"alerts\.slack is declared twice"):
        settings("alerts", "slack", "again")(Other)
    with pytest.raises(TypeError, match="frozen dataclass"):
        settings("alerts", "plain", "not a dataclass")(object)

    @dataclasses.dataclass(frozen=True)
    class Core:
        other: int = 0

    settings("test_parent", "other", "clashes with Core.other")(Other)
    with pytest.raises(TypeError, match=r"reuse the keys \['other'\]"):
        assemble(Core, "test_parent", "Assembled", discover="rankwatch.actions.alerts.sinks")
