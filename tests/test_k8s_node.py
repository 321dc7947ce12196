"""Node mode on Kubernetes with real processes: the real gRPC client against a stand-in
kubelet pod-resources server on a unix socket, and `rankwatch watch --k8s` over a fake node
layout (a /proc-like cgroup map of real trainer pids and a /var/log/pods tree in CRI format)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import pytest

pytest.importorskip("grpc")

from conftest import free_port, wait_for
from podresources_standin import serving
from rankwatch.k8s.podresources import ContainerDevices, PodResources, PodResourcesError, list_pods

UID_A = "0b3c3a52-8a4e-4f76-9b7a-2f1d6c0e5a11"
UID_B = "7f2e9d10-1c5b-4e2a-8d3f-9a6b4c2e1d22"
CID_A = "a" * 64
CID_B = "b" * 64
GPU_B = "GPU-99999999-0000-1111-2222-333344447777"
GPUS_A = ["GPU-6f1a2b3c-0000-1111-2222-333344445555", "GPU-7e2b3c4d-0000-1111-2222-333344446666"]


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A unix socket path must stay under 108 bytes; pytest's tmp_path may not."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rwk8s") as d:
        yield Path(d)


@pytest.mark.process
def test_the_grpc_client_lists_pods_containers_and_gpu_uuids(short_tmp: Path) -> None:
    sock = short_tmp / "kubelet.sock"
    layout = {
        ("ml", "llama-worker-0"): {
            "trainer": [("nvidia.com/gpu", GPUS_A), ("example.com/nic", ["nic0"])],
            "rankwatch-sidecar": [],
        },
        ("default", "web-0"): {"nginx": []},
    }
    with serving(sock, layout) as lister:
        pods = list_pods(str(sock), timeout=5)
    assert lister.calls == 1
    assert (
        PodResources(
            "ml",
            "llama-worker-0",
            (ContainerDevices("trainer", tuple(GPUS_A)), ContainerDevices("rankwatch-sidecar", ())),
        )
        in pods
    )
    assert PodResources("default", "web-0", (ContainerDevices("nginx", ()),)) in pods
    assert pods[0].gpus() == tuple(GPUS_A)


@pytest.mark.process
def test_no_kubelet_socket_is_one_clear_error(short_tmp: Path) -> None:
    with pytest.raises(PodResourcesError, match=r"pod-resources List on .* failed: StatusCode\.UNAVAILABLE"):
        list_pods(str(short_tmp / "absent.sock"), timeout=2)


def _cri_pump(src: IO[bytes], dst: Path) -> threading.Thread:
    """What containerd does with a container's stdout: each line as a CRI record, lines longer
    than a small buffer cut into P pieces (containerd's is 16 KiB; small here so the joiner
    has work on every step line: no "loss=nan" fits in one piece)."""

    def run() -> None:
        with open(dst, "ab", buffering=0) as out:
            for raw in iter(src.readline, b""):
                text = raw.rstrip(b"\n")
                now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
                pieces = [text[i : i + 7] for i in range(0, len(text), 7)] or [b""]
                for i, piece in enumerate(pieces):
                    tag = b"F" if i == len(pieces) - 1 else b"P"
                    out.write(now + b" stdout " + tag + b" " + piece + b"\n")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _trainer(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "rankwatch.demo.trainer", "--format", "kv", "--step-time", "0.05", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )


def _node_run(node: Path, *, gpu: str = "gpu: {enabled: false}", env: dict[str, str] | None = None,
              until: str = 'kind="nan_loss"') -> tuple[list[dict[str, object]], str, str, Path]:  # fmt: skip
    """Two pods on a fake node, run `rankwatch watch --k8s` until /metrics holds ``until``:
    pod A opted in with a NaN at step 40, pod B (the same rank number) not opted in, NaN too."""
    proc, pods, links = node / "proc", node / "pods", node / "containers"
    links.mkdir()
    log_a = pods / f"ml_llama-worker-1_{UID_A}" / "trainer" / "0.log"
    log_b = pods / f"ml_other-0_{UID_B}" / "trainer" / "0.log"
    for log in (log_a, log_b):
        log.parent.mkdir(parents=True)
        log.touch()
    (links / f"llama-worker-1_ml_trainer-{CID_A}.log").touch()
    (links / f"other-0_ml_trainer-{CID_B}.log").touch()
    a = _trainer({"RANKWATCH_WATCH": "true", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"},
                 "--seed", "9101", "--steps", "100000", "--fault", "nan@40")  # fmt: skip
    b = _trainer({"RANK": "1"}, "--seed", "9102", "--steps", "100000", "--fault", "nan@40")
    pumps = [_cri_pump(a.stdout, log_a), _cri_pump(b.stdout, log_b)]  # type: ignore[arg-type]
    systemd = (
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope\n"
    )
    for p, uid, cid in ((a, UID_A, CID_A), (b, UID_B, CID_B)):
        (proc / str(p.pid)).mkdir(parents=True)
        (proc / str(p.pid) / "cgroup").write_text(systemd.format(uid.replace("-", "_"), cid))
    (proc / "1").mkdir()
    (proc / "1" / "cgroup").write_text("0::/init.scope\n")
    sock = node / "kubelet.sock"
    port = free_port()
    cfg = node / "rw.yaml"
    cfg.write_text(
        "detectors: {warmup_steps: 5}\nprocess: {sample_interval: 200ms}\n"
        f"dumps: {{dir: {node / 'dumps'}}}\nserver: {{listen: '127.0.0.1:{port}'}}\n{gpu}\n"
        f"kubernetes: {{proc_root: {proc}, pod_logs: {pods}, container_logs: {links}, "
        f"pod_resources_socket: {sock}, interval: 200ms}}\n"
    )
    found = node / "f.jsonl"
    layout = {
        ("ml", "llama-worker-1"): {"trainer": [("nvidia.com/gpu", GPUS_A)]},
        ("ml", "other-0"): {"trainer": [("nvidia.com/gpu", [GPU_B])]},
    }
    agent = None
    try:
        with serving(sock, layout):
            agent = subprocess.Popen(
                [sys.executable, "-m", "rankwatch", "-v", "watch", "--k8s", "--config", str(cfg),
                 "--findings-jsonl", str(found)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            )  # fmt: skip

            def nans() -> list[dict[str, object]]:
                if not found.exists():
                    return []
                rows = [json.loads(x) for x in found.read_text().splitlines() if x.strip()]
                return [f for f in rows if f["kind"] == "nan_loss"]

            got = wait_for(nans, timeout=60, what="a nan_loss finding")

            def metrics() -> str:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                        return str(r.read().decode())
                except OSError:
                    return ""

            text = wait_for(
                lambda: (m := metrics()) and "rankwatch_pod_gpu_info{" in m and until in m and m,
                timeout=30,
                what=until,
            )
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=30)
    finally:
        for p in (a, b):
            p.kill()
            p.wait(timeout=10)
        for t in pumps:
            t.join(timeout=10)
        if agent is not None and agent.poll() is None:
            agent.kill()
    return got, text, err, log_a


@pytest.mark.process
def test_watch_k8s_reports_a_nan_in_one_opted_in_pod_with_its_pod_and_gpus(short_tmp: Path) -> None:
    got, text, err, log_a = _node_run(short_tmp)
    assert len(got) == 1 and got[0]["rank"] == 1, got
    assert got[0]["path"] == str(log_a), got  # read from the pod's CRI log, pieces joined
    # The finding's series carries the pod's run (the JSONL sink writes the agent's own run).
    fired = [x for x in text.splitlines() if x.startswith("rankwatch_findings_total{") and "nan_loss" in x]
    assert fired and all('run="llama"' in x and 'rank="1"' in x for x in fired), fired
    info = [x for x in text.splitlines() if x.startswith("rankwatch_pod_info{")]
    assert len(info) == 1, info  # pod B is not opted in
    for want in ('namespace="ml"', 'pod="llama-worker-1"', 'container="trainer"', 'run="llama"', 'rank="1"'):
        assert want in info[0], info
    uuids = sorted(x.split('uuid="')[1].split('"')[0] for x in text.splitlines()
                   if x.startswith("rankwatch_pod_gpu_info{"))  # fmt: skip
    assert uuids == sorted(GPUS_A)
    assert "other-0" not in text
    assert "pod ml/llama-worker-1 container trainer: rank 1 of run llama" in err, err[-3000:]


@pytest.mark.tool
def test_the_pod_gpus_from_the_kubelet_pick_the_ranks_gpu_in_real_nvml(short_tmp: Path) -> None:
    """pynvml over the stand-in libnvidia-ml (tests/nvml_standin): the node has three GPUs; the
    kubelet gave pod A the last two; its rank has LOCAL_RANK 1 and no CUDA_VISIBLE_DEVICES, so
    its GPU is the container's second one, host index 2, found by UUID. NVML lists no compute
    process (the trainers use none), so only the pod-resources mapping ties it."""
    from test_gpu_standin import _build, _env

    lib = _build(short_tmp / "nvml")
    state = short_tmp / "nvml-state.txt"
    state.write_text(
        f"count 3\ngpu0.uuid {GPU_B}\ngpu1.uuid {GPUS_A[0]}\ngpu2.uuid {GPUS_A[1]}\n"
        "gpu0.util 11\ngpu1.util 22\ngpu2.util 87\n"
    )
    node = short_tmp / "node"
    node.mkdir()
    _, text, _, _ = _node_run(
        node, gpu="gpu: {interval: 200ms}", env=_env(lib, state), until="rankwatch_gpu_utilization_ratio{"
    )
    util = [x for x in text.splitlines() if x.startswith("rankwatch_gpu_utilization_ratio{")]
    # GPU series still carry the agent's run label (per-pipeline labels there are issue 28's);
    # the rank and the UUID tie them to the pod's rankwatch_pod_gpu_info.
    mine = [x for x in util if 'rank="1"' in x]
    assert len(mine) == 1 and f'uuid="{GPUS_A[1]}"' in mine[0] and 'gpu="2"' in mine[0], util
    assert mine[0].endswith(" 0.87"), mine


@pytest.mark.process
@pytest.mark.parametrize("kubelet_restart", [False, True], ids=["in-container", "container-restarted"])
def test_a_restarted_rank_is_watched_again(short_tmp: Path, kubelet_restart: bool) -> None:
    """torchrun's --max-restarts inside the container: a new pid with the same pod, container
    and rank is attached to the pipeline that watched the old one. A container the kubelet
    restarted (a new container ID, its output in 1.log): a new pipeline follows 1.log."""
    node = short_tmp
    proc, pods, links = node / "proc", node / "pods", node / "containers"
    links.mkdir()
    (pods / f"ml_bert-0-x7k2p_{UID_A}" / "trainer").mkdir(parents=True)
    (pods / f"ml_bert-0-x7k2p_{UID_A}" / "trainer" / "0.log").touch()
    stop = node / "stop"
    script = (
        "import os, sys, time\n"
        "t = time.monotonic()\n"
        "while not os.path.exists(sys.argv[1]) and time.monotonic() - t < 60: time.sleep(0.05)\n"
    )
    cgroup = f"0::/kubepods/burstable/pod{UID_A}/{CID_A}\n"
    env = {**os.environ, "RANKWATCH_WATCH": "true", "RANK": "0"}

    def start(path: Path, cg: str = cgroup) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", script, str(path)], env=env)
        (proc / str(p.pid)).mkdir(parents=True)
        (proc / str(p.pid) / "cgroup").write_text(cg)
        return p

    first = start(stop)
    cfg = node / "rw.yaml"
    cfg.write_text(
        f"process: {{sample_interval: 100ms}}\ndumps: {{dir: {node / 'dumps'}}}\n"
        f"server: {{listen: '127.0.0.1:{free_port()}'}}\ngpu: {{enabled: false}}\n"
        f"kubernetes: {{proc_root: {proc}, pod_logs: {pods}, container_logs: {links}, "
        "pod_resources_socket: '', interval: 100ms, enabled: true}\n"
    )
    err = node / "agent.err"
    second = None
    with open(err, "w") as fh:
        agent = subprocess.Popen(
            [sys.executable, "-m", "rankwatch", "-v", "watch", "--config", str(cfg)],  # kubernetes.enabled
            stdout=subprocess.DEVNULL, stderr=fh,
        )  # fmt: skip
    try:
        wait_for(lambda: f"watching pid {first.pid}" in err.read_text(), timeout=30, what="first pid")
        stop.touch()
        first.wait(timeout=30)
        wait_for(lambda: "exit" in err.read_text().split(f"watching pid {first.pid}")[1], timeout=30,
                 what="the first pid's exit")  # fmt: skip
        log1 = pods / f"ml_bert-0-x7k2p_{UID_A}" / "trainer" / "1.log"
        if kubelet_restart:
            log1.touch()
            second = start(node / "stop-2", cgroup.replace(CID_A, CID_B))
        else:
            second = start(node / "stop-2")
        wait_for(lambda: f"watching pid {second.pid}" in err.read_text(), timeout=30, what="second pid")
        if kubelet_restart:
            with open(log1, "a") as out:
                for step in range(1, 13):
                    out.write(f"2024-05-01T10:00:{step:02d}Z stdout F step={step} loss={2.0 - step / 100}\n")
                out.write("2024-05-01T10:00:13Z stdout F step=13 loss=nan\n")
            wait_for(lambda: "nan_loss" in err.read_text(), timeout=30, what="the NaN in 1.log")
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    finally:
        (node / "stop-2").touch()
        for p in (first, second, agent):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait(timeout=10)
    text = err.read_text()
    pipelines = text.count("pod ml/bert-0-x7k2p container trainer: rank 0 of run bert")
    assert pipelines == (2 if kubelet_restart else 1), text[-3000:]
    if kubelet_restart:
        assert f"log {log1}" in text, text[-3000:]
