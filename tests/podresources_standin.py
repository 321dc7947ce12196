"""A stand-in kubelet pod-resources server: the public proto's servicer on a unix socket, so
the agent's real gRPC client talks to it as it would to the kubelet."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from rankwatch.k8s.podresources import LIST_METHOD
from rankwatch.k8s.podresources_v1 import api_pb2

# (namespace, pod) -> container -> [(resource_name, device_ids)]
Layout = Mapping[tuple[str, str], Mapping[str, list[tuple[str, list[str]]]]]


class _Lister:
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
    service, method = LIST_METHOD.strip("/").split("/")
    handler = grpc.unary_unary_rpc_method_handler(
        lister.List,
        request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
        response_serializer=api_pb2.ListPodResourcesResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, {method: handler}),))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield lister
    finally:
        server.stop(grace=None).wait(5)
