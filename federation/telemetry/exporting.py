"""Whether a process's spans leave it, and how a child is pointed at a collector: what the
standard ``OTEL_*`` variables say, read without the SDK.

The daemon and the command lines it builds need to know this without configuring anything, so
it stands apart from :mod:`federation.telemetry.setup`, which only entry points import.
"""

from __future__ import annotations

from collections.abc import Mapping

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")


def exporting(environ: Mapping[str, str]) -> bool:
    """Whether spans leave a process that runs with ``environ``."""
    return (any(environ.get(name) for name in ENDPOINT_VARIABLES)
            and environ.get("OTEL_SDK_DISABLED", "").lower() != "true"
            and environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() != "none")


def exporter_environment(endpoint: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that point a child's exporter at ``endpoint`` (``http://host:port``),
    unless ``environ`` already names an endpoint: the user's Jaeger or Tempo wins."""
    if any(environ.get(name) for name in ENDPOINT_VARIABLES):
        return {}
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
