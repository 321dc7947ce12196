"""The chart's node mode (mode: daemonset), rendered by real Helm and validated strictly by
kubernetes-validate like the rest of the chart (tests/test_deploy_kubernetes.py drives both;
the daemonset CI values file is also linted, validated and config-checked there)."""

from __future__ import annotations

import pytest

from test_deploy_kubernetes import _agent_config, _kinds, _mounts, _one, _render, _validate_all


@pytest.mark.tool
def test_daemonset_mode_renders_a_least_privilege_node_agent_and_no_sidecar() -> None:
    docs = _render("daemonset")
    _validate_all(docs)
    kinds = _kinds(docs)
    # The sidecar's example Job and its rendezvous Service are not rendered.
    assert "DaemonSet" in kinds and "Job" not in kinds and "Service" not in kinds
    ds = _one(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert pod.get("hostNetwork") is not True and pod.get("hostIPC") is not True
    assert pod["automountServiceAccountToken"] is False  # no Kubernetes API access
    (agent,) = pod["containers"]
    assert "initContainers" not in pod
    assert agent["args"][:2] == ["watch", "--k8s"] and "--fail-open" in agent["args"]
    sc = agent["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["runAsUser"] == 0 and sc["runAsNonRoot"] is False  # why: templates/daemonset.yaml
    assert "privileged" not in sc
    mounts = _mounts(agent)
    volumes = {v["name"]: v for v in pod["volumes"]}
    host = {n: v["hostPath"]["path"] for n, v in volumes.items() if "hostPath" in v}
    assert host == {
        "pod-logs": "/var/log/pods",
        "container-logs": "/var/log/containers",
        "pod-resources": "/var/lib/kubelet/pod-resources",
    }
    assert all(mounts[n]["readOnly"] is True for n in host)  # every host path read-only
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"
    # Fail open: a missing Secret never keeps the agent from starting.
    refs = [e["valueFrom"]["secretKeyRef"] for e in agent["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert {r["name"] for r in refs} == {"rankwatch-tokens", "slack"} and all(r["optional"] for r in refs)
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"  # NVML sees the node's GPUs; it requests none
    assert "nvidia.com/gpu" not in str(agent.get("resources"))
    cfg = _agent_config(docs)
    assert cfg["kubernetes"] == {
        "enabled": True,
        "opt_in_env": "RANKWATCH_WATCH",
        "namespaces": ["ml-team"],
        "pod_resources_socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
    }
    assert cfg["server"]["listen"].endswith(f":{agent['ports'][0]['containerPort']}")
    monitor = _one(docs, "PodMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )


@pytest.mark.tool
def test_sidecar_mode_renders_no_daemonset() -> None:
    assert "DaemonSet" not in _kinds(_render("default"))
