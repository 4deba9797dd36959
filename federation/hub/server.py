"""The hub as a gRPC server: both services, health, reflection, TLS, and its published state.

:func:`serve` is the embeddable core (tests run a hub in-process on port 0);
``python -m federation.hub`` is its command line. The hub listens on loopback unless told
otherwise, and on TLS unless explicitly told ``--insecure``. Once it serves, it publishes
``<state dir>/hub.json`` (:class:`HubInfo`: pid, address, the CA a client needs, where the
fleet token is) for the CLI and the operator on the same host.

Every call of both services is traced (OpenTelemetry's gRPC instrumentation, continuing the
context in the call's metadata); health checks and reflection are not. The SDK is set up by
the entry point; ``tracer_provider`` is for tests that keep their own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from federation.api import fleet_pb2, fleet_pb2_grpc, member_pb2, member_pb2_grpc
from federation.client import tokens, tracing
from federation.client.discovery import HubFiles, HubInfo
from federation.hub.core import Hub, HubSettings
from federation.hub.services import FleetService, MemberService
from primitives.files import write_private

logger = logging.getLogger(__name__)

SERVICES = (
    member_pb2.DESCRIPTOR.services_by_name["MemberService"].full_name,
    fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
)
#: Keepalive both ways: a peer that vanished without a FIN is noticed within ~30 s even when
#: no heartbeat is due.
OPTIONS = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
]


@dataclasses.dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path
    ca: Path


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    hub: HubSettings
    listen: str = "127.0.0.1:0"
    tls: Tls | None = None


async def serve(settings: ServeSettings, *, stop_flag: asyncio.Event,
                ready: Callable[[HubInfo], None] | None = None,
                tracer_provider: trace.TracerProvider | None = None) -> None:
    """Serve until ``stop_flag`` is set; the state is stored and the port closed on return."""
    files = HubFiles(settings.hub.state_dir)
    settings.hub.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = tokens.load_or_create_key(files.key)
    write_private(files.fleet_token, (tokens.fleet_token(key) + "\n").encode())
    hub = Hub(settings.hub, tracer_provider=tracer_provider)
    await hub.start()
    server = grpc.aio.server(options=OPTIONS,
                             interceptors=[tracing.server_interceptor(tracer_provider)])
    member_pb2_grpc.add_MemberServiceServicer_to_server(MemberService(hub, key), server)
    fleet_pb2_grpc.add_FleetServiceServicer_to_server(FleetService(hub, key), server)
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    reflection.enable_server_reflection(
        (*SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME), server)
    if settings.tls is not None:
        credentials = grpc.ssl_server_credentials(
            [(settings.tls.key.read_bytes(), settings.tls.cert.read_bytes())])
        port = server.add_secure_port(settings.listen, credentials)
    else:
        port = server.add_insecure_port(settings.listen)
    if port == 0:
        raise OSError(f"the hub cannot listen on {settings.listen}")
    await server.start()
    host = settings.listen.rsplit(":", 1)[0]
    info = HubInfo(pid=os.getpid(), address=f"{host}:{port}",
                   ca=str(settings.tls.ca) if settings.tls else None,
                   fleet_token_file=str(files.fleet_token), hub_id=hub.hub_id)
    for service in ("", *SERVICES):
        await checks.set(service, health_pb2.HealthCheckResponse.SERVING)
    info.write(files.info)
    logger.info("hub %s serves on %s (%s)", hub.hub_id, info.address,
                "TLS" if settings.tls else "insecure")
    if ready is not None:
        ready(info)
    try:
        await stop_flag.wait()
    finally:
        files.info.unlink(missing_ok=True)
        for service in ("", *SERVICES):
            await checks.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await hub.stop()
        await server.stop(grace=1.0)
