"""Which pod (and container) a process belongs to, from its ``/proc/<pid>/cgroup``.

The kubelet puts every pod in a cgroup named after its UID and the runtime puts each
container below it, named after the container ID. The names take two shapes, one per
cgroup driver, under both cgroup v1 (``<hierarchy-id>:<controllers>:<path>`` lines, one per
controller) and v2 (one ``0::<path>`` line):

- ``systemd`` driver (kubelet ``cgroupDriver: systemd``; the default of kubeadm since 1.22):
  ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``
  with the dashes of the UID turned into underscores (systemd reserves ``-`` in slice names:
  kubelet ``pkg/kubelet/cm/cgroup_manager_linux.go``, ``ToSystemd`` / ``escapeSystemdCgroupName``),
  and ``crio-<id>.scope`` / ``docker-<id>.scope`` for CRI-O and cri-dockerd.
- ``cgroupfs`` driver: ``/kubepods/burstable/pod<uid>/<id>`` (``pod`` + UID as is:
  kubelet ``pkg/kubelet/cm/pod_container_manager_linux.go``, ``GetPodContainerName``;
  the container directory is the bare 64-hex ID, containerd's and CRI-O's cgroupfs parent).

Guaranteed pods sit directly under ``kubepods`` (no QoS level). Nothing here opens a file of
the job's: the caller reads the cgroup text (bounded) and passes it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["PodRef", "pod_of_cgroup"]

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_SYSTEMD_POD = re.compile(r"kubepods(?:-(?:besteffort|burstable))?-pod(?P<uid>" + _UID + r")\.slice")
_CGROUPFS_POD = re.compile(r"/kubepods(?:/(?:besteffort|burstable))?/pod(?P<uid>" + _UID + r")(?:/|$)")
# The container: a runtime-prefixed systemd scope, or the bare ID directory under the pod.
_SCOPE = re.compile(r"(?:cri-containerd|crio|docker|cri-o)-(?P<id>[0-9a-f]{64})\.scope")
_BARE = re.compile(r"/pod" + _UID + r"/(?P<id>[0-9a-f]{64})(?:/|$)")


@dataclass(frozen=True)
class PodRef:
    uid: str  # with dashes, as the API server and /var/log/pods spell it
    container_id: str | None  # 64 hex digits, without the runtime's prefix


def pod_of_cgroup(text: str) -> PodRef | None:
    """The pod of the first line that names one (v2's single line, or any v1 controller);
    ``None`` for a process outside Kubernetes' pods (the node's own daemons)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _SYSTEMD_POD.search(path) or _CGROUPFS_POD.search(path)
        if m is None:
            continue
        uid = m.group("uid").replace("_", "-").lower()
        c = _SCOPE.search(path) or _BARE.search(path)
        return PodRef(uid, c.group("id") if c else None)
    return None
