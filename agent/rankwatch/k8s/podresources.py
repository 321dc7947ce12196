"""The kubelet's pod-resources API: which devices each container of the node was given.

The kubelet serves ``k8s.io/kubelet/pkg/apis/podresources/v1`` (``PodResourcesLister``) on
the unix socket ``/var/lib/kubelet/pod-resources/kubelet.sock``; dcgm-exporter reads it the
same way to put ``namespace``/``pod``/``container`` on GPU series. ``List`` answers every
pod of the node with its containers and their devices: for the NVIDIA device plugin,
``resource_name`` ``nvidia.com/gpu`` and ``device_ids`` the GPU UUIDs (``GPU-…``; MIG
devices ``MIG-…``). No API server access is needed.

``grpcio`` is the optional extra ``rankwatch[k8s]``: this module imports it only when asked
to list, and says how to install it when it is missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_SOCKET",
    "GPU_RESOURCES",
    "ContainerDevices",
    "PodResources",
    "PodResourcesError",
    "list_pods",
]

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet's service and method, as api.proto names them (package v1, service PodResourcesLister).
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = ("nvidia.com/gpu",)
# The kubelet answers from memory; dcgm-exporter waits 10 s for it. A socket that does not
# answer must not hold a discovery round of the node daemon longer than that.
LIST_TIMEOUT_S = 10.0
# The kubelet allows 16 MiB messages on this socket (podresources.DefaultQPS server options).
MAX_MESSAGE_BYTES = 16 << 20


class PodResourcesError(RuntimeError):
    """The API cannot be asked (grpcio missing, no socket, no answer); the message says which."""


@dataclass(frozen=True)
class ContainerDevices:
    name: str
    gpus: tuple[str, ...]  # device IDs of the GPU resources (UUIDs), in the kubelet's order


@dataclass(frozen=True)
class PodResources:
    namespace: str
    name: str
    containers: tuple[ContainerDevices, ...] = field(default=())

    def gpus(self, container: str | None = None) -> tuple[str, ...]:
        out: list[str] = []
        for c in self.containers:
            if container is None or c.name == container:
                out.extend(g for g in c.gpus if g not in out)
        return tuple(out)


def list_pods(
    socket: str = DEFAULT_SOCKET,
    *,
    timeout: float = LIST_TIMEOUT_S,
    gpu_resources: Sequence[str] = GPU_RESOURCES,
) -> list[PodResources]:
    """One ``List`` call. Blocking: run it off the event loop."""
    try:
        import grpc

        from rankwatch.k8s.podresources_v1 import api_pb2
    except ImportError as e:
        raise PodResourcesError(
            f"the kubelet pod-resources API needs grpcio: pip install 'rankwatch[k8s]' ({e})"
        ) from e
    opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=opts) as channel:
            # The one call the agent makes, bound on the channel with the proto's own messages: no
            # generated service module (its servicer half is a server's, which the agent is not).
            list_call = channel.unary_unary(
                LIST_METHOD,
                request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
                response_deserializer=api_pb2.ListPodResourcesResponse.FromString,
            )
            resp = list_call(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        detail = e.details() if hasattr(e, "details") else str(e)
        raise PodResourcesError(f"pod-resources List on {socket} failed: {code}: {detail}") from e
    wanted = set(gpu_resources)
    return [
        PodResources(
            namespace=p.namespace,
            name=p.name,
            containers=tuple(
                ContainerDevices(
                    c.name,
                    tuple(d for dev in c.devices if dev.resource_name in wanted for d in dev.device_ids),
                )
                for c in p.containers
            ),
        )
        for p in resp.pod_resources
    ]


def visible_devices(gpus: Sequence[str], cuda_visible: str | None) -> str | None:
    """The rank's GPUs as host-wide UUIDs, for ``CUDA_VISIBLE_DEVICES`` as the agent on the host
    reads it. Inside the container the devices are numbered from 0 in the order the device
    plugin listed them (the container toolkit exposes ``NVIDIA_VISIBLE_DEVICES`` in that order),
    so the rank's own numeric ``CUDA_VISIBLE_DEVICES`` picks from ``gpus``; UUIDs pass as they
    are. ``None``: nothing known (no GPU from the kubelet)."""
    if not gpus:
        return None
    if cuda_visible is None or not cuda_visible.strip():
        return ",".join(gpus)
    out: list[str] = []
    for entry in cuda_visible.split(","):
        e = entry.strip()
        if e.isdigit():
            if int(e) >= len(gpus):
                break  # CUDA stops at the first invalid entry
            out.append(gpus[int(e)])
        elif e:
            out.append(e)
    return ",".join(out) if out else ""
