"""Which Kubernetes pod and container a process belongs to, and that container's log file.

The node agent (the chart's ``mode: daemonset``) watches training processes of other pods
through the host's process table (``hostPID``) without any edit to their pod specs. Their
stdout is a pipe to the container runtime, which writes it to the kubelet's log file:
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`` (CRI format, whose
``<time> stdout F`` prefix the parsers already strip), linked from
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log``. A process's
``/proc/<pid>/cgroup`` names its pod UID and container id, with either cgroup driver:

- cgroupfs: ``.../kubepods/burstable/pod<uid>/<container id>``
- systemd:  ``.../kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope``
  (``crio-<id>.scope``, ``docker-<id>.scope``)

Nothing here follows a link it has not checked: the ``/var/log/containers`` entry must point
into the pods folder, at the folder of the pod UID the cgroup names, and the file there must
be a regular file. Reads are bounded.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from rankwatch.k8s.cgroup import pod_of_cgroup

PROC = "/proc"
CONTAINERS_DIR = "/var/log/containers"
PODS_DIR = "/var/log/pods"
_CGROUP_MAX = 64 << 10

# <pod>_<namespace>_<container>-<64 hex>.log (the kubelet's /var/log/containers names)
_LINK_NAME = re.compile(r"^(?P<pod>[^_/]+)_(?P<ns>[^_/]+)_(?P<container>[^/]+)-(?P<id>[0-9a-f]{64})\.log$")


@dataclass(frozen=True)
class PodContainer:
    namespace: str
    pod: str
    uid: str
    container: str
    container_id: str
    log: Path

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


def pod_of(pid: int, proc: str = PROC) -> tuple[str, str] | None:
    """``(pod uid, container id)`` from the process's cgroup, or None (not in a pod)."""
    try:
        fd = os.open(f"{proc}/{pid}/cgroup", os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        data = os.read(fd, _CGROUP_MAX)
    except OSError:
        return None
    finally:
        os.close(fd)
    ref = pod_of_cgroup(data.decode("utf-8", "replace"))  # the one reading of kubelet's cgroup forms
    if ref is None or ref.container_id is None:
        return None
    return ref.uid, ref.container_id


def container_log(
    pid: int, *, proc: str = PROC, containers_dir: str = CONTAINERS_DIR, pods_dir: str = PODS_DIR
) -> PodContainer | None:
    """The pod, container and log file of ``pid``, or None when it is not in a pod or its
    log cannot be trusted (a link out of the pods folder, another pod's folder, not a file)."""
    found = pod_of(pid, proc)
    if found is None:
        return None
    uid, cid = found
    try:
        names = [n for n in os.listdir(containers_dir) if n.endswith(f"-{cid}.log")]
    except OSError:
        return None
    for name in names:
        m = _LINK_NAME.match(name)
        if m is None:
            continue
        try:
            target = os.readlink(os.path.join(containers_dir, name))
        except OSError:
            continue
        real = Path(os.path.normpath(os.path.join(containers_dir, target)))
        root = Path(os.path.normpath(pods_dir))
        try:
            rel = real.relative_to(root)
        except ValueError:
            continue  # a link out of the pods folder
        parts = rel.parts
        want_dir = f"{m['ns']}_{m['pod']}_{uid}"
        if len(parts) != 3 or parts[0] != want_dir or parts[1] != m["container"]:
            continue  # not this pod's (or this container's) folder
        try:
            for part in (root / parts[0], root / parts[0] / parts[1]):
                if not stat.S_ISDIR(os.lstat(part).st_mode):
                    raise OSError("not a folder")
            if not stat.S_ISREG(os.lstat(real).st_mode):
                continue
        except OSError:
            continue
        return PodContainer(m["ns"], m["pod"], uid, m["container"], cid, real)
    return None
