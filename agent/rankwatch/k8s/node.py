"""The opted-in rank processes of this Kubernetes node, their pods, logs and GPUs.

A DaemonSet with ``hostPID`` sees every process of the node. For each one the kernel's
``/proc/<pid>/cgroup`` names its pod UID and container ID (``cgroup.py``); the kubelet's
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/<n>.log`` gives namespace, pod name and
the container's log, ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log`` (names
only, never followed) which container an ID is, and the pod-resources API the GPUs of each
container. Nothing here needs the API server.

Opt-in: a pod's labels and annotations are only known to the API server, so a process is
watched when its own environment says so (``kubernetes.opt_in_env``, one ``env`` entry in the
pod spec) or its pod is in one of ``kubernetes.namespaces``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rankwatch.config.schema import KubernetesConfig, RunConfig
from rankwatch.identity import LOCAL_RANK_VARS, RANK_VARS, RUN_VARS, WORLD_VARS, identity_from_env
from rankwatch.k8s.cgroup import PodRef, pod_of_cgroup
from rankwatch.k8s.podresources import PodResources, PodResourcesError, list_pods

log = logging.getLogger("rankwatch.k8s")

__all__ = ["RankProcess", "Scanner", "run_of_pod"]

CGROUP_MAX_BYTES = 64 << 10  # v1 lists one line per controller; a few hundred bytes in practice
MAX_PODS = 1024  # a node runs at most 110 pods by default (kubelet maxPods); bound what a scan keeps
MAX_CONTAINERS = 16 * MAX_PODS
_LINK = re.compile(r"(?P<pod>[^_]+)_(?P<ns>[^_]+)_(?P<c>.+)-(?P<id>[0-9a-f]{64})\.log")
_TRUE = {"1", "true", "yes", "on"}
# Names the controllers give: PyTorchJob/MPIJob "<job>-master-0"/"<job>-worker-3", an indexed
# Job "<job>-<index>-<hash>", JobSet "<jobset>-<replicatedjob>-<job>-<index>-<hash>",
# LeaderWorkerSet "<lws>-<group>-<index>". The hash alphabet is apimachinery's
# rand.String (consonants and digits, no vowels): a real word is never taken for one.
_SUFFIX = re.compile(
    r"(?:-(?:master|worker|launcher|leader|chief|ps|evaluator))?(?:-\d+)*(?:-[bcdfghjklmnpqrstvwxz2456789]{5})?$"
)


@dataclasses.dataclass(frozen=True)
class RankProcess:
    pid: int
    namespace: str
    pod: str
    uid: str
    container: str
    log: Path | None  # the container's current CRI log
    gpus: tuple[str, ...]  # GPU device IDs of the container (pod-resources), kubelet order
    cuda_visible_devices: str | None  # the rank's own, as it set it (container-relative)
    run: str
    rank: int | None
    local_rank: int | None
    world_size: int | None


def run_of_pod(pod: str) -> str:
    """The job a pod belongs to, from its name: the controller's suffixes off."""
    return _SUFFIX.sub("", pod) or pod


def _read_cgroup(proc_root: str, pid: int) -> str | None:
    try:
        fd = os.open(f"{proc_root}/{pid}/cgroup", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return os.read(fd, CGROUP_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _environ(pid: int) -> dict[str, str]:
    import psutil

    try:
        return psutil.Process(pid).environ()
    except Exception:
        return {}


def _alive(pid: int) -> bool:
    """Running, not a zombie: a rank that exited stays in /proc until its launcher reaps it,
    and its restarted successor must not be taken for it."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except Exception:
        return False


def _ppid(pid: int) -> int | None:
    import psutil

    try:
        return psutil.Process(pid).ppid()
    except Exception:
        return None


def _int(env: Mapping[str, str], names: Sequence[str]) -> int | None:
    for n in names:
        v = env.get(n, "").strip()
        if v.isdigit():
            return int(v)
    return None


def _latest_log(folder: Path) -> Path | None:
    """``<n>.log`` with the highest n: the container's current instance (n counts restarts)."""
    best: tuple[int, Path] | None = None
    with contextlib.suppress(OSError):
        for e in os.scandir(folder):
            stem, dot, ext = e.name.partition(".")
            if dot and ext == "log" and stem.isdigit() and (best is None or int(stem) > best[0]):
                best = (int(stem), Path(e.path))
    return best[1] if best else None


class Scanner:
    """One scan per call (blocking: run it off the loop). Remembers each pid's cgroup and
    environment, which do not change for the life of a process."""

    def __init__(
        self,
        cfg: KubernetesConfig,
        *,
        lister: Callable[..., list[PodResources]] = list_pods,
        environ: Callable[[int], dict[str, str]] = _environ,
        alive: Callable[[int], bool] = _alive,
    ) -> None:
        self.cfg = cfg
        self.lister = lister
        self.environ = environ
        self.alive = alive
        self._pods: dict[int, PodRef | None] = {}
        self._env: dict[int, dict[str, str]] = {}
        self.problem: str | None = None  # why the last pod-resources List failed
        self._keys = (*RANK_VARS, *LOCAL_RANK_VARS, *WORLD_VARS, *RUN_VARS, "CUDA_VISIBLE_DEVICES")

    def _pod_dirs(self) -> dict[str, tuple[str, str, Path]]:
        out: dict[str, tuple[str, str, Path]] = {}
        with contextlib.suppress(OSError):
            for e in os.scandir(self.cfg.pod_logs):
                parts = e.name.split("_")
                if len(parts) == 3 and e.is_dir(follow_symlinks=False) and len(out) < MAX_PODS:
                    out[parts[2].lower()] = (parts[0], parts[1], Path(e.path))
        return out

    def _container_names(self) -> dict[str, str]:
        out: dict[str, str] = {}
        with contextlib.suppress(OSError):
            for e in os.scandir(self.cfg.container_logs):
                m = _LINK.fullmatch(e.name)
                if m is not None and len(out) < MAX_CONTAINERS:
                    out[m.group("id")] = m.group("c")
        return out

    def _gpus(self) -> dict[tuple[str, str], PodResources]:
        if not self.cfg.pod_resources_socket:
            return {}
        try:
            pods = self.lister(self.cfg.pod_resources_socket, gpu_resources=self.cfg.gpu_resources)
        except PodResourcesError as e:
            if self.problem != str(e):
                log.warning("no GPU mapping for pods: %s", e)
            self.problem = str(e)
            return {}
        self.problem = None
        return {(p.namespace, p.name): p for p in pods}

    def scan(self) -> list[RankProcess]:
        pids: list[int] = []
        with contextlib.suppress(OSError):
            pids = sorted(int(e.name) for e in os.scandir(self.cfg.proc_root) if e.name.isdigit())
        live = set(pids)
        for gone in [p for p in self._pods if p not in live]:
            self._pods.pop(gone, None)
            self._env.pop(gone, None)
        dirs = self._pod_dirs()
        candidates: list[tuple[int, PodRef]] = []
        for pid in pids:
            if pid not in self._pods:
                text = _read_cgroup(self.cfg.proc_root, pid)
                self._pods[pid] = pod_of_cgroup(text) if text is not None else None
            ref = self._pods[pid]
            if ref is not None and ref.uid in dirs:
                candidates.append((pid, ref))
        if not candidates:
            return []
        names = self._container_names()
        gpus = self._gpus()
        chosen: dict[tuple[str, str, int | None], list[tuple[int, dict[str, str], str]]] = {}
        for pid, ref in candidates:
            ns, pod, folder = dirs[ref.uid]
            env = self._env.get(pid)
            if env is None:
                # Only what identity and opt-in read: a process's environment can be megabytes.
                full = self.environ(pid)
                env = self._env[pid] = {k: full[k] for k in (*self._keys, self.cfg.opt_in_env) if k in full}
            if (
                env.get(self.cfg.opt_in_env, "").strip().lower() not in _TRUE
                and ns not in self.cfg.namespaces
            ):
                continue
            if not self.alive(pid):
                continue
            container = names.get(ref.container_id or "", "")
            if not container:
                with contextlib.suppress(OSError):
                    subs = [e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
                    container = subs[0] if len(subs) == 1 else ""
            chosen.setdefault((ref.uid, container, _int(env, RANK_VARS)), []).append((pid, env, container))
        out: list[RankProcess] = []
        # Several ranks in one container (torchrun --nproc-per-node 8) write one container log:
        # the lowest rank's pipeline reads it (lines a launcher tags with a rank go to that
        # rank), the others watch their process only, so no line is read and reported twice.
        readers: dict[tuple[str, str], int | None] = {}
        for uid, container, rank in sorted(chosen, key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
            readers.setdefault((uid, container), rank)
        for (uid, container, rank), procs in chosen.items():
            mine = {p for p, _, _ in procs}
            # A rank's own workers (DataLoader) inherit its RANK: the rank is the one whose
            # parent is not of the same rank.
            top = [(p, env) for p, env, _ in procs if _ppid(p) not in mine] or [(procs[0][0], procs[0][1])]
            pid, env = top[0]
            ns, pod, folder = dirs[uid]
            run = identity_from_env(RunConfig(), env).run
            if run == "default":
                run = run_of_pod(pod)
            res = gpus.get((ns, pod))
            out.append(
                RankProcess(
                    pid=pid,
                    namespace=ns,
                    pod=pod,
                    uid=uid,
                    container=container,
                    log=_latest_log(folder / container)
                    if container and readers[(uid, container)] == rank
                    else None,
                    gpus=res.gpus(container) if res is not None else (),
                    run=run,
                    rank=rank,
                    local_rank=_int(env, LOCAL_RANK_VARS),
                    world_size=_int(env, WORLD_VARS),
                    cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
                )
            )
        return out
