"""Trace context across the hops that OpenTelemetry's own propagators do not reach: W3C
``traceparent`` strings in gRPC stream messages, in Kubernetes annotations and in fault entries.
Uses ``opentelemetry-api`` only, so library code may import it.

- :func:`traceparent` renders the current (or a given) span's context; "" when there is none,
  so an untraced caller writes nothing.
- :func:`parent` turns a received ``traceparent`` into a Context to start a *child* span in
  (synchronous work: a command executed because a message said so).
- :func:`links` turns it into a Link for a span that starts its own trace-local work later
  (asynchronous work: a reconciler acting on an object some time after it was written).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from primitives import keys

HEADER = "traceparent"

_PROPAGATOR = TraceContextTextMapPropagator()


def traceparent(span: trace.Span | None = None) -> str:
    """The W3C traceparent of ``span`` (default: the current span); "" if it has no valid
    context."""
    span = span if span is not None else trace.get_current_span()
    if not span.get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(HEADER, "")


def parent(value: str | None) -> otel_context.Context | None:
    """The Context to start a child span in, from a received traceparent; None (the current
    context) when ``value`` is empty or malformed."""
    if not value:
        return None
    extracted = _PROPAGATOR.extract({HEADER: value})
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        return None
    return extracted


def span_context(value: str | None) -> trace.SpanContext | None:
    """The remote SpanContext a traceparent names, or None."""
    context = parent(value)
    if context is None:
        return None
    return trace.get_current_span(context).get_span_context()


def links(*values: str | None) -> list[trace.Link]:
    """Links to the spans these traceparents name (empty and malformed ones are skipped)."""
    found = (span_context(value) for value in values)
    return [trace.Link(context) for context in found if context is not None]


def from_annotations(annotations: Mapping[str, str] | None) -> str:
    """The traceparent an object carries in :data:`~primitives.keys.TRACEPARENT`, or ""."""
    return (annotations or {}).get(keys.TRACEPARENT, "")


def headers() -> dict[str, str]:
    """The ``traceparent`` header for an outgoing HTTP request made in the current span (empty
    when the current span is not recording or not sampled: an API server then starts no trace
    for it)."""
    context = trace.get_current_span().get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return {}
    value = traceparent()
    return {HEADER: value} if value else {}
