"""Channels to a hub: TLS with the hub's CA (or plaintext when there is none, for tests on
loopback), keepalive, the bearer token every call carries, and the trace context of a call
made inside a span (:mod:`federation.client.tracing`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import grpc
from opentelemetry import trace

from federation.client import tracing

#: A link that went quiet without a FIN (a partition, a killed hub) is noticed within ~20 s.
OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 32 * 1024 * 1024),
    # Reconnects are paced by the caller's own back-off, not gRPC's longer default.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


@dataclasses.dataclass(frozen=True)
class HubAddress:
    """Where a hub is and how to trust it."""

    address: str
    ca: bytes | None = None
    """The hub's CA certificate (PEM); None: plaintext (loopback tests and benchmarks)."""

    @classmethod
    def of(cls, address: str, ca_file: str | Path | None) -> HubAddress:
        return cls(address=address, ca=Path(ca_file).read_bytes() if ca_file else None)


def open_channel(hub: HubAddress, *,
                 tracer_provider: trace.TracerProvider | None = None) -> grpc.aio.Channel:
    interceptors = tracing.client_interceptors(tracer_provider)
    if hub.ca is None:
        return grpc.aio.insecure_channel(hub.address, options=OPTIONS,
                                         interceptors=interceptors)
    return grpc.aio.secure_channel(hub.address, grpc.ssl_channel_credentials(hub.ca),
                                   options=OPTIONS, interceptors=interceptors)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def health(hub: HubAddress, *, timeout: float = 3.0) -> tuple[bool, str]:
    """Whether the hub says it serves (the gRPC health service), and what went wrong if not."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    channel = open_channel(hub)
    try:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # its type stubs lack the methods
        answer = await stub.Check(
            health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    except grpc.aio.AioRpcError as error:
        return False, f"{error.code().name}: {error.details()}"
    finally:
        await channel.close()
    serving = answer.status == health_pb2.HealthCheckResponse.SERVING
    return serving, "ok" if serving else health_pb2.HealthCheckResponse.ServingStatus.Name(
        answer.status)
