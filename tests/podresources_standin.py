"""A stand-in kubelet pod-resources server: the public proto's servicer on a unix socket, so
the agent's real gRPC client talks to it as it would to the kubelet."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from rankwatch.k8s.podresources_v1 import api_pb2, api_pb2_grpc

# (namespace, pod) -> container -> [(resource_name, device_ids)]
Layout = Mapping[tuple[str, str], Mapping[str, list[tuple[str, list[str]]]]]


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.calls = 0

    def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    namespace=ns,
                    name=name,
                    containers=[
                        api_pb2.ContainerResources(
                            name=c,
                            devices=[
                                api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devs
                            ],
                            cpu_ids=[2, 3],
                        )
                        for c, devs in containers.items()
                    ],
                )
                for (ns, name), containers in self.layout.items()
            ]
        )


@contextmanager
def serving(socket: Path, layout: Layout) -> Iterator[_Lister]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    lister = _Lister(layout)
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield lister
    finally:
        server.stop(grace=None).wait(5)
