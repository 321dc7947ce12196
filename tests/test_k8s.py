"""Node mode on Kubernetes, the parts without a process: pods from cgroup paths, the CRI log
format back to the trainer's lines, run names from pod names, a node scan over a fake layout."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from rankwatch.config.schema import KubernetesConfig
from rankwatch.k8s.cgroup import PodRef, pod_of_cgroup
from rankwatch.k8s.crilog import Joiner, parse
from rankwatch.k8s.node import Scanner, run_of_pod
from rankwatch.k8s.podresources import ContainerDevices, PodResources, PodResourcesError
from rankwatch.sources.follower import LogFollower
from rankwatch.sources.lines import FollowedLine

UID = "9d8d8b5c-3b4f-4a0e-9d51-6c2a1f0e7b12"
CID = "4e1c9a0b7d2f" + "0" * 40 + "1234abcd5678"
assert len(CID) == 64

# Each form as the kubelet and the runtimes write it; where each comes from:
CGROUPS = {
    # cgroup v2, systemd driver, containerd: kubelet cgroup_manager_linux.go (ToSystemd escapes
    # "-" in the UID as "_"), containerd's systemd cgroup "cri-containerd-<id>.scope".
    "v2 systemd containerd": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    f"{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
    # cgroup v2, systemd driver, CRI-O ("crio-<id>.scope", CRI-O's conmon/cgroup code).
    "v2 systemd cri-o": f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
    f"{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
    # Guaranteed QoS: the pod slice sits right under kubepods.slice (no QoS level).
    "v2 systemd guaranteed": f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope\n",
    # cgroup v1, cgroupfs driver: pod_container_manager_linux.go "pod" + UID, the container
    # directory is the bare ID; one line per hierarchy.
    "v1 cgroupfs": f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n"
    f"11:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n",
    # cgroup v1, systemd driver: every controller line carries the same slice path.
    "v1 systemd": f"10:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
    f"{UID.replace('-', '_')}.slice/docker-{CID}.scope\n",
    # cgroup v2, cgroupfs driver (k3s, kind): the same names as v1 in the single line.
    "v2 cgroupfs guaranteed": f"0::/kubepods/pod{UID}/{CID}\n",
}


@pytest.mark.unit
@pytest.mark.parametrize("form", sorted(CGROUPS))
def test_the_pod_and_container_of_each_cgroup_form(form: str) -> None:
    assert pod_of_cgroup(CGROUPS[form]) == PodRef(UID, CID)


@pytest.mark.unit
def test_processes_outside_pods_and_the_pod_itself_are_told_apart() -> None:
    assert pod_of_cgroup("0::/system.slice/containerd.service\n") is None
    assert pod_of_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") is None
    assert pod_of_cgroup("") is None
    # The pod's own cgroup (no container below it yet): the pod, no container.
    assert pod_of_cgroup(f"0::/kubepods/burstable/pod{UID}\n") == PodRef(UID, None)


@pytest.mark.unit
def test_cri_lines_are_parsed_and_other_text_is_not() -> None:
    c = parse("2024-05-01T10:00:00.123456789Z stdout F step 10 loss 2.5")
    assert c is not None and (c.stream, c.partial, c.text) == ("stdout", False, "step 10 loss 2.5")
    c = parse("2024-05-01T10:00:00.1+02:00 stderr P Traceback")
    assert c is not None and c.partial and c.stream == "stderr"
    empty = parse("2024-05-01T10:00:00Z stdout F")
    assert empty is not None and empty.text == ""
    assert parse("step 10 loss 2.5") is None
    assert parse("2024-05-01 10:00:00 stdout F x") is None  # not RFC 3339


def _lines(*texts: str) -> list[FollowedLine]:
    return [FollowedLine(t, i + 1) for i, t in enumerate(texts)]


@pytest.mark.unit
def test_partial_pieces_are_joined_per_stream() -> None:
    j = Joiner(1 << 20)
    out = j.feed(
        _lines(
            "2024-05-01T10:00:00.1Z stdout P step 10 lo",
            "2024-05-01T10:00:00.2Z stderr F a warning",
            "2024-05-01T10:00:00.3Z stdout P ss nan",
            "2024-05-01T10:00:00.4Z stdout F  lr 0.1",
            "plain text that is not CRI",
        )
    )
    assert [(o.text, o.lineno) for o in out] == [
        ("a warning", 2),
        ("step 10 loss nan lr 0.1", 1),
        ("plain text that is not CRI", 5),
    ]
    assert j.joined == 1


@pytest.mark.unit
def test_a_partial_line_is_bounded_and_marked_cut() -> None:
    j = Joiner(10)
    out = j.feed(
        _lines(*[f"2024-05-01T10:00:00Z stdout P {'x' * 8}"] * 4, "2024-05-01T10:00:00Z stdout F end")
    )
    assert len(out) == 1 and out[0].text == "x" * 10 and out[0].cut
    assert j.feed(_lines("2024-05-01T10:00:00Z stdout P held")) == []
    rest = j.flush()
    assert [(r.text, r.cut) for r in rest] == [("held", True)]


@pytest.mark.unit
def test_a_line_cut_across_a_rotation_is_joined(tmp_path: Path) -> None:
    """The kubelet renames 0.log and the runtime reopens a new one: the follower reads on in the
    new file, and a line whose P piece ended the old file gets its F piece from the new one."""
    log = tmp_path / "0.log"
    log.write_text("2024-05-01T10:00:00Z stdout F step 1 loss 2.0\n2024-05-01T10:00:01Z stdout P step 2 lo\n")
    j = Joiner(1 << 20)
    got: list[str] = []
    with LogFollower(log, from_end=False) as f:
        got += [x.text for x in j.feed(f.read_available(1 << 20))]
        os.rename(log, tmp_path / "0.log.20240501-100002")
        log.write_text(
            "2024-05-01T10:00:02Z stdout F ss nan\n2024-05-01T10:00:03Z stdout F step 3 loss 1.0\n"
        )
        for _ in range(3):  # the follower notices the new file on a read
            got += [x.text for x in j.feed(f.read_available(1 << 20))]
    assert got == ["step 1 loss 2.0", "step 2 loss nan", "step 3 loss 1.0"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("pod", "run"),
    [
        ("llama-master-0", "llama"),  # Kubeflow PyTorchJob
        ("llama-worker-3", "llama"),
        ("bert-0-x7k2p", "bert"),  # indexed Job: <job>-<index>-<hash>
        ("lws-0-1", "lws"),  # LeaderWorkerSet: <lws>-<group>-<index>
        ("pretrain-b9xq4", "pretrain"),
        ("my-train", "my-train"),  # "train" is no generated hash (it has a vowel)
    ],
)
def test_the_run_of_a_pod_from_its_name(pod: str, run: str) -> None:
    assert run_of_pod(pod) == run


def _node(tmp: Path, procs: dict[int, str]) -> KubernetesConfig:
    proc, pods, links = tmp / "proc", tmp / "pods", tmp / "containers"
    for pid, cg in procs.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(cg)
    (pods / f"ml_llama-worker-1_{UID}" / "trainer").mkdir(parents=True)
    (pods / f"ml_llama-worker-1_{UID}" / "trainer" / "0.log").touch()
    (pods / f"ml_llama-worker-1_{UID}" / "trainer" / "1.log").touch()  # restarted once: 1.log is current
    (pods / f"ml_llama-worker-1_{UID}" / "rankwatch-unrelated").mkdir()
    links.mkdir()
    (links / f"llama-worker-1_ml_trainer-{CID}.log").touch()
    return KubernetesConfig(
        proc_root=str(proc), pod_logs=str(pods), container_logs=str(links), pod_resources_socket="sock"
    )


@pytest.mark.unit
def test_a_node_scan_finds_opted_in_ranks_with_their_pod_log_and_gpus(tmp_path: Path) -> None:
    cg = CGROUPS["v2 systemd containerd"]
    cfg = _node(tmp_path, {100: cg, 101: cg, 102: cg, 200: "0::/system.slice/sshd.service\n"})
    envs = {
        100: {"RANKWATCH_WATCH": "true", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"},
        101: {"RANKWATCH_WATCH": "true", "RANK": "3"},  # its DataLoader worker: same RANK, child of 100
        102: {"RANK": "5"},  # not opted in
    }
    lists: list[str] = []

    def lister(socket: str, *, gpu_resources: object) -> list[PodResources]:
        lists.append(socket)
        return [PodResources("ml", "llama-worker-1", (ContainerDevices("trainer", ("GPU-a", "GPU-b")),))]

    scanner = Scanner(cfg, lister=lister, environ=lambda pid: envs.get(pid, {}), alive=lambda pid: True)
    import rankwatch.k8s.node as node

    parents = {101: 100}
    real = node._ppid
    node._ppid = lambda pid: parents.get(pid, 1)  # type: ignore[assignment]
    try:
        found = scanner.scan()
    finally:
        node._ppid = real  # type: ignore[assignment]
    assert len(found) == 1
    rp = found[0]
    assert (rp.pid, rp.namespace, rp.pod, rp.container, rp.uid) == (
        100,
        "ml",
        "llama-worker-1",
        "trainer",
        UID,
    )
    assert (rp.run, rp.rank, rp.local_rank, rp.world_size) == ("llama", 3, 1, 8)
    assert rp.gpus == ("GPU-a", "GPU-b")
    assert rp.log == Path(cfg.pod_logs) / f"ml_llama-worker-1_{UID}" / "trainer" / "1.log"
    assert lists == ["sock"]


@pytest.mark.unit
def test_a_namespace_opts_every_rank_of_it_in_and_a_dead_socket_only_costs_the_gpus(tmp_path: Path) -> None:
    cfg = _node(tmp_path, {100: CGROUPS["v1 cgroupfs"]})
    cfg = dataclasses.replace(cfg, namespaces=("ml",))

    def lister(socket: str, *, gpu_resources: object) -> list[PodResources]:
        raise PodResourcesError("pod-resources List on sock failed: UNAVAILABLE")

    scanner = Scanner(
        cfg, lister=lister, environ=lambda pid: {"TORCHELASTIC_RUN_ID": "job-42"}, alive=lambda pid: True
    )
    found = scanner.scan()
    assert [(r.pid, r.run, r.rank, r.gpus) for r in found] == [(100, "job-42", None, ())]
    assert scanner.problem is not None and "UNAVAILABLE" in scanner.problem


@pytest.mark.unit
def test_a_ranks_container_relative_gpus_become_host_uuids() -> None:
    from rankwatch.k8s.podresources import visible_devices

    gpus = ("GPU-a", "GPU-b", "GPU-c")
    assert visible_devices(gpus, None) == "GPU-a,GPU-b,GPU-c"  # all of the container's
    assert visible_devices(gpus, "1") == "GPU-b"  # torchrun-style one GPU per rank
    assert visible_devices(gpus, "2,0") == "GPU-c,GPU-a"
    assert visible_devices(gpus, "GPU-c") == "GPU-c"
    assert visible_devices(gpus, "0,7,1") == "GPU-a"  # CUDA stops at the first bad entry
    assert visible_devices((), "0") is None


@pytest.mark.unit
def test_without_grpcio_the_client_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from rankwatch.k8s.podresources import list_pods

    monkeypatch.setitem(sys.modules, "grpc", None)  # as if grpcio were not installed
    with pytest.raises(PodResourcesError, match=r"pip install 'rankwatch\[k8s\]'"):
        list_pods("/nonexistent.sock")


@pytest.mark.unit
def test_ranks_sharing_a_container_read_its_log_once(tmp_path: Path) -> None:
    """torchrun with two workers in one container: two pipelines, one of them reads the log."""
    cg = CGROUPS["v2 cgroupfs guaranteed"]
    cfg = _node(tmp_path, {300: cg, 301: cg, 302: cg, 303: cg})
    envs = {
        303: {"RANKWATCH_WATCH": "1", "RANK": "1", "LOCAL_RANK": "1"},  # rank 1 before a restart: a zombie
        300: {"RANKWATCH_WATCH": "1"},  # torchrun itself: no RANK
        301: {"RANKWATCH_WATCH": "1", "RANK": "0", "LOCAL_RANK": "0"},
        302: {"RANKWATCH_WATCH": "1", "RANK": "1", "LOCAL_RANK": "1"},
    }
    scanner = Scanner(
        dataclasses.replace(cfg, pod_resources_socket=""),
        environ=lambda pid: envs[pid],
        lister=list,
        alive=lambda pid: pid != 303,
    )
    by_rank = {r.rank: r for r in scanner.scan()}
    assert sorted(by_rank, key=str) == [0, 1, None]
    assert by_rank[1].pid == 302  # not the exited one still in /proc
    readers = [r for r in by_rank.values() if r.log is not None]
    assert [r.rank for r in readers] == [None]  # the launcher's pipeline reads the shared log
