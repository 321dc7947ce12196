"""A process's pod, container and kubelet log file (the node agent's log discovery).

The cgroup paths are the kubelet's naming for both cgroup drivers (cgroupfs:
``kubepods/<qos>/pod<uid>/<id>``; systemd: ``kubepods-<qos>-pod<uid with _>.slice/
<runtime>-<id>.scope``), and the log layout is the kubelet's (``/var/log/containers`` links to
``/var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rankwatch.sources.kubepods import container_log, pod_of

UID = "3f1c2b9e-8d4a-4b6f-9c2e-1a2b3c4d5e6f"
CID = "a" * 64
OTHER_UID = "00000000-1111-2222-3333-444444444444"

CGROUPS = {
    "v1-cgroupfs": f"12:memory:/kubepods/burstable/pod{UID}/{CID}\n"
    f"11:cpu:/kubepods/burstable/pod{UID}/{CID}\n",
    "v2-systemd-containerd": "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
    "v2-systemd-crio": f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n",
    "v2-cgroupfs-guaranteed": f"0::/kubepods/pod{UID}/{CID}\n",
}


def _tree(tmp_path: Path, cgroup: str, pid: int = 4242) -> dict[str, str]:
    proc = tmp_path / "proc" / str(pid)
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    pods = tmp_path / "pods" / f"ml_train-0_{UID}" / "trainer"
    pods.mkdir(parents=True)
    (pods / "0.log").write_text("2024-05-01T10:00:00.000000000Z stdout F step=1 loss=2.0\n")
    links = tmp_path / "containers"
    links.mkdir()
    (links / f"train-0_ml_trainer-{CID}.log").symlink_to(pods / "0.log")
    return {"proc": str(tmp_path / "proc"), "containers_dir": str(links), "pods_dir": str(tmp_path / "pods")}


@pytest.mark.unit
@pytest.mark.parametrize("driver", sorted(CGROUPS))
def test_a_pod_process_is_mapped_to_its_container_log(tmp_path: Path, driver: str) -> None:
    where = _tree(tmp_path, CGROUPS[driver])
    assert pod_of(4242, where["proc"]) == (UID, CID)
    pc = container_log(4242, **where)
    assert pc is not None and str(pc) == "ml/train-0/trainer" and pc.uid == UID
    assert pc.log == tmp_path / "pods" / f"ml_train-0_{UID}" / "trainer" / "0.log"


@pytest.mark.unit
def test_a_process_outside_any_pod_has_none(tmp_path: Path) -> None:
    where = _tree(tmp_path, "0::/user.slice/user-1000.slice/session-3.scope\n")
    assert pod_of(4242, where["proc"]) is None and container_log(4242, **where) is None
    assert container_log(999999, **where) is None  # gone


@pytest.mark.unit
@pytest.mark.parametrize("plant", ["outside", "other-pod", "fifo", "dir-symlink"])
def test_a_log_link_that_cannot_be_trusted_is_not_followed(tmp_path: Path, plant: str) -> None:
    where = _tree(tmp_path, CGROUPS["v1-cgroupfs"])
    link = Path(where["containers_dir"]) / f"train-0_ml_trainer-{CID}.log"
    link.unlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("db_password=hunter2\n")
    if plant == "outside":
        link.symlink_to(secret)
    elif plant == "other-pod":
        other = tmp_path / "pods" / f"ml_train-0_{OTHER_UID}" / "trainer"
        other.mkdir(parents=True)
        (other / "0.log").write_text("not this pod\n")
        link.symlink_to(other / "0.log")
    elif plant == "fifo":
        target = tmp_path / "pods" / f"ml_train-0_{UID}" / "trainer" / "1.log"
        os.mkfifo(target)
        link.symlink_to(target)
    else:
        real = tmp_path / "pods" / f"ml_train-0_{UID}" / "trainer"
        moved = tmp_path / "elsewhere"
        real.rename(moved)
        real.symlink_to(moved)
        link.symlink_to(real / "0.log")
    assert container_log(4242, **where) is None
