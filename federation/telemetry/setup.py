"""The OpenTelemetry SDK set-up that an entry point (operator, engine, hub, CLI) calls once.

Only entry points configure the SDK; library code uses ``opentelemetry-api`` alone, whose calls
do nothing until :func:`configure` has run. What is configured:

- a Resource naming the process: ``service.name`` (the entry point's; it wins over
  ``OTEL_SERVICE_NAME``, which every child inherits and so cannot tell them apart),
  ``k8s.cluster.name`` when the process works for one cluster, ``service.instance.id``, and
  whatever ``OTEL_RESOURCE_ATTRIBUTES`` adds;
- the sampler from ``OTEL_TRACES_SAMPLER`` (default ``parentbased_always_on``: a trace begun
  elsewhere is kept or dropped as its parent was);
- a BatchSpanProcessor (``OTEL_BSP_*``) with the OTLP/gRPC exporter (``OTEL_EXPORTER_OTLP_*``;
  gRPC only: another ``OTEL_EXPORTER_OTLP_PROTOCOL`` is warned about)
  when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set: the
  daemon of ``fakefleet up`` sets it to its embedded collector, a user to Jaeger or Tempo.
  Without one, spans are made (so context still propagates) but exported nowhere.

``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none`` turn exporting off.
"""

from __future__ import annotations

import logging
import os
import uuid

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from federation.telemetry.exporting import PROTOCOL_VARIABLES, exporting

logger = logging.getLogger(__name__)

_configured: TracerProvider | None = None


def configure(service_name: str, cluster: str | None = None, *,
              set_global: bool = True) -> TracerProvider:
    """Set up the SDK for this process (from its ``OTEL_*`` variables) and return its
    TracerProvider.

    ``set_global=False`` leaves the API's global provider alone (tests configure several
    providers in one process, and the API lets the global one be set only once).
    """
    global _configured
    if set_global and _configured is not None:
        raise RuntimeError("the OpenTelemetry SDK is already configured in this process: "
                           "call configure() once, from the entry point")
    attributes: dict[str, str] = {"service.name": service_name,
                                  "service.instance.id": str(uuid.uuid4())}
    if cluster:
        attributes["k8s.cluster.name"] = cluster
    provider = TracerProvider(resource=Resource.create(attributes))
    if exporting(os.environ):
        for name in PROTOCOL_VARIABLES:
            if os.environ.get(name, "grpc") != "grpc":
                logger.warning("%s=%s is not supported: fakefleet exports OTLP over gRPC (give "
                               "the gRPC port of your endpoint, usually 4317)", name,
                               os.environ[name])
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if set_global:
        trace.set_tracer_provider(provider)
        _configured = provider
    return provider


def shutdown() -> None:
    """Export what is still buffered and stop exporting: call it before the process exits."""
    global _configured
    if _configured is not None:
        _configured.shutdown()
        _configured = None
