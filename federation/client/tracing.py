"""Tracing of the federation's gRPC calls and of the commands their messages carry.

OpenTelemetry's gRPC instrumentation makes a span per call and carries a unary call's context
in its metadata; a stream gets one span for its whole life, so the context of each command on
a member's session travels in the messages' own ``traceparent`` field instead
(:mod:`primitives.propagation`). This module is the one place that sets the
instrumentation up, for the hub (:func:`server_interceptor`) and its clients
(:func:`client_interceptors`), and names what the spans of commands carry.

What is traced, and what is not:

- unary calls only. A stream's span would stay open for the stream's whole life (a member's
  session lasts hours), and the instrumentation cannot end it cleanly when the client goes
  away (it logs "Failed to detach context" at every session's end); what flows on a session
  is traced per message instead, and a watch is a read;
- a client traces a call only when it is made inside a span (a CLI command, a test): the
  background calls of a hub link (Register at every reconnect) and health probes start no
  trace of their own;
- health checks and reflection are never traced, by either side.

Uses ``opentelemetry-api`` and the instrumentation only; the SDK is configured by entry points.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import (
    aio_client_interceptors,
    aio_server_interceptor,
    filters,
)
from opentelemetry.util.types import AttributeValue

from federation.api import fleet_pb2, member_pb2
from primitives import propagation

CLUSTER = "k8s.cluster.name"
COMMAND_ID = "fakefleet.command.id"
COMMAND_KIND = "fakefleet.command.kind"
#: The fleet run (or workload) the command belongs to: Command.run_id.
RUN_ID = "fakefleet.run.id"
WORKLOAD_ID = "fakefleet.workload.id"
#: The hub sent the command before (the member never acknowledged it).
RESEND = "fakefleet.command.resend"
#: The member had the command already: this delivery did nothing.
DUPLICATE = "fakefleet.command.duplicate"
PHASE = "fakefleet.command.phase"
VERDICT = "fakefleet.command.verdict"

_KINDS = {"start_plan": "StartPlan", "stop_plan": "StopPlan", "create_job": "CreateJob",
          "delete_jobs": "DeleteJobs"}
#: The hub's calls that answer with a stream (Session, the watches).
STREAMS = frozenset(f"/{service.full_name}/{method.name}"
                    for module in (fleet_pb2, member_pb2)
                    for service in module.DESCRIPTOR.services_by_name.values()
                    for method in service.methods if method.server_streaming)
_UNTRACED = filters.any_of(filters.health_check(),
                           filters.service_prefix("grpc.reflection."),
                           *(filters.full_method_name(name) for name in sorted(STREAMS)))


def command_kind(command: member_pb2.Command) -> str:
    """StartPlan, StopPlan, CreateJob or DeleteJobs ("" for a command with no action)."""
    return _KINDS.get(command.WhichOneof("action") or "", "")


def command_attributes(cluster: str, command: member_pb2.Command) -> dict[str, AttributeValue]:
    """What a span about ``command`` in ``cluster`` says, on the hub and on the member alike."""
    attributes: dict[str, AttributeValue] = {
        CLUSTER: cluster, COMMAND_ID: command.id, COMMAND_KIND: command_kind(command)}
    if command.HasField("create_job") or command.HasField("delete_jobs"):
        attributes[WORKLOAD_ID] = command.run_id
    else:
        attributes[RUN_ID] = command.run_id
    return attributes


def _inside_a_span(details: Any) -> bool:
    """Trace a call only as part of a trace already begun, and never a health probe."""
    return trace.get_current_span().get_span_context().is_valid and not _UNTRACED(details)


def client_interceptors(tracer_provider: trace.TracerProvider | None = None
                        ) -> list[grpc.aio.ClientInterceptor]:
    """Interceptors for a channel to the hub: a unary call made inside a span is a span, and
    carries its context in the call's metadata."""
    every: list[grpc.aio.ClientInterceptor] = aio_client_interceptors(  # type: ignore[no-untyped-call]
        tracer_provider=tracer_provider, filter_=_inside_a_span)
    # Streams go through no interceptor at all: an intercepted stream is slower per message.
    return [interceptor for interceptor in every
            if isinstance(interceptor, grpc.aio.UnaryUnaryClientInterceptor)]


def server_interceptor(tracer_provider: trace.TracerProvider | None = None
                       ) -> grpc.aio.ServerInterceptor:
    """The hub's interceptor: a span per unary FleetService and MemberService call,
    continuing the context the caller's metadata carries."""
    interceptor: grpc.aio.ServerInterceptor = aio_server_interceptor(  # type: ignore[no-untyped-call]
        tracer_provider=tracer_provider, filter_=filters.negate(_UNTRACED))
    return interceptor


@contextlib.contextmanager
def within(traceparent: str) -> Iterator[None]:
    """Run the block in the context ``traceparent`` names (no span at all when it is empty),
    so that what the block sends on says which command it is about."""
    token = otel_context.attach(propagation.parent(traceparent) or otel_context.Context())
    try:
        yield
    finally:
        otel_context.detach(token)
