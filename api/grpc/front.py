"""The gRPC listener beside HTTP (`loraplex serve --grpc-port`), on the same event loop and server parts: the
inference service, `grpc.health.v1` health checking (SERVING when ready, NOT_SERVING from the start of a drain) and
server reflection. A message larger than the HTTP body limit is refused by gRPC itself (RESOURCE_EXHAUSTED)."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from api.grpc import inference_pb2
from api.grpc.inference_pb2_grpc import add_GRPCInferenceServiceServicer_to_server
from api.grpc.servicer import InferenceServicer
from api.server.holder import Server

SERVICE = inference_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


class GrpcFront:
    def __init__(self, server: Server, host: str, port: int):
        self.server = server
        self.address = f"{host}:{port}"
        self.port: int | None = None
        self._grpc: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()

    async def start(self) -> int:
        """Binds and serves; returns the bound port (0 asks for a free one)."""
        limit = self.server.config.input_limits.max_body_bytes
        self._grpc = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                              ("grpc.max_send_message_length", limit)])
        add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self.server), self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        # Reflection reads the service's private descriptor pool (api/grpc/generate.py), health's added to it.
        pool = inference_pb2.DESCRIPTOR.pool
        try:
            pool.FindFileByName(health_pb2.DESCRIPTOR.name)
        except KeyError:
            pool.AddSerializedFile(health_pb2.DESCRIPTOR.serialized_pb)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            self._grpc, pool=pool)
        self.port = self._grpc.add_insecure_port(self.address)
        await self._grpc.start()
        await self._health.set(SERVICE, health_pb2.HealthCheckResponse.SERVING)
        await self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.server.lifecycle.on_drain.append(self._on_drain)
        return self.port

    def _on_drain(self) -> None:
        asyncio.get_running_loop().create_task(self._health.enter_graceful_shutdown())

    async def stop(self, grace_s: float) -> None:
        """Refuses new calls at once; calls in flight get `grace_s` to finish, then are cancelled."""
        if self._grpc is not None:
            await self._grpc.stop(grace_s)
