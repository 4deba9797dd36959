"""From an OTLP ``ExportTraceServiceRequest`` to the rows the span store keeps, and the spans it
refuses, each with the field that is wrong.

Purely computational: no I/O; the receiver passes the time of its clock. It decides what to
answer (OK, OTLP's ``partial_success``, or INVALID_ARGUMENT) from what :func:`decode` returns.

A span is refused when it cannot be placed in a trace: a trace id that is not 16 bytes or is all
zero, a span id that is not 8 bytes or is all zero, a parent span id or a link id of the wrong
length, no start time, an end before its start, or a time more than :data:`AHEAD_NS` past the
collector's clock (which also keeps every time below 2262, past which SQLite cannot hold it).
A span from the future would outlive every real trace under age-based retention, so it is not
stored. Everything else (unknown attribute types, empty names) is stored as it came, since a
trace viewer is more useful with a span that looks odd than without it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8
SERVICE_NAME = "service.name"
CLUSTER_NAME = "k8s.cluster.name"
#: How far past the collector's clock a span may start or end: clocks that NTP keeps apart
#: differ by far less.
AHEAD_NS = 10 * 60 * 10**9
#: What the SDKs report when nobody named the service.
UNKNOWN_SERVICE = "unknown_service"


@dataclasses.dataclass(frozen=True)
class SpanRow:
    """One span as the store keeps it (ids in lowercase hex, times in ns since the epoch)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    service: str
    cluster: str | None
    kind: int
    scope: str
    start_ns: int
    end_ns: int
    status_code: int
    status_message: str
    attributes: str
    """JSON object of the span's attributes."""
    resource: str
    """JSON object of the resource's attributes (shared by the spans of one process)."""
    events: str
    """JSON list of ``{"name", "time_ns", "attributes"}``."""
    links: str
    """JSON list of ``{"trace_id", "span_id", "attributes"}``."""


@dataclasses.dataclass(frozen=True)
class Rejection:
    """A span that was not stored: where it is in the request and what is wrong with it."""

    field: str
    """Path of the offending field, e.g. ``resource_spans[0].scope_spans[1].spans[2].span_id``."""
    problem: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


@dataclasses.dataclass(frozen=True)
class Decoded:
    rows: list[SpanRow]
    rejections: list[Rejection]

    def summary(self, limit: int = 3) -> str:
        """The rejections in one message: the first few in full, then how many more."""
        shown = "; ".join(str(r) for r in self.rejections[:limit])
        more = len(self.rejections) - limit
        return f"{shown}; and {more} more" if more > 0 else shown


def decode(request: ExportTraceServiceRequest, *, now_ns: int) -> Decoded:
    """The storable spans of ``request`` and a rejection for each span that is not, at
    ``now_ns`` (ns since the epoch) on the collector's clock."""
    rows: list[SpanRow] = []
    rejections: list[Rejection] = []
    for r, resource_spans in enumerate(request.resource_spans):
        resource = attributes_of(resource_spans.resource.attributes)
        service = str(resource.get(SERVICE_NAME) or UNKNOWN_SERVICE)
        resource_json = _json(resource)
        for s, scope_spans in enumerate(resource_spans.scope_spans):
            scope = scope_spans.scope.name
            for i, span in enumerate(scope_spans.spans):
                rejection = check(span, f"resource_spans[{r}].scope_spans[{s}].spans[{i}]",
                                  latest_ns=now_ns + AHEAD_NS)
                if rejection is not None:
                    rejections.append(rejection)
                    continue
                attributes = attributes_of(span.attributes)
                # A span about one cluster (the hub's fan-out to a member) names it even when
                # its process works for another or for none.
                cluster = attributes.get(CLUSTER_NAME) or resource.get(CLUSTER_NAME)
                status = span.status
                rows.append(SpanRow(
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex() or None,
                    name=span.name, service=service,
                    cluster=str(cluster) if cluster else None, kind=span.kind, scope=scope,
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    status_code=status.code, status_message=status.message,
                    attributes=_json(attributes), resource=resource_json,
                    events=_json([
                        {"name": e.name, "time_ns": e.time_unix_nano,
                         "attributes": attributes_of(e.attributes)} for e in span.events
                    ]) if span.events else "[]",
                    links=_json([
                        {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(),
                         "attributes": attributes_of(link.attributes)} for link in span.links
                    ]) if span.links else "[]",
                ))
    return Decoded(rows, rejections)


#: One encoder for every span: ``json.dumps`` with options builds a new one on each call.
_json = json.JSONEncoder(separators=(",", ":")).encode


def check(span: Span, where: str, *, latest_ns: int) -> Rejection | None:
    """The first reason why ``span`` cannot be stored, or None; no time may be past
    ``latest_ns``."""
    if problem := _id_problem(span.trace_id, TRACE_ID_BYTES, "trace id", required=True):
        return Rejection(f"{where}.trace_id", problem)
    if problem := _id_problem(span.span_id, SPAN_ID_BYTES, "span id", required=True):
        return Rejection(f"{where}.span_id", problem)
    if problem := _id_problem(span.parent_span_id, SPAN_ID_BYTES, "span id", required=False):
        return Rejection(f"{where}.parent_span_id", f"{problem} (or empty for a root span)")
    if span.start_time_unix_nano == 0:
        return Rejection(f"{where}.start_time_unix_nano",
                         "missing: a span needs its start time in ns since the epoch")
    for field, value in (("start_time_unix_nano", span.start_time_unix_nano),
                         ("end_time_unix_nano", span.end_time_unix_nano)):
        if value > latest_ns:
            return Rejection(f"{where}.{field}",
                             f"{value} is {(value - latest_ns + AHEAD_NS) / 1e9:.0f}s ahead of "
                             f"the collector's clock, more than {AHEAD_NS // 10**9}s: give ns "
                             f"since the epoch, and set the sender's clock right")
    if span.end_time_unix_nano < span.start_time_unix_nano:
        return Rejection(
            f"{where}.end_time_unix_nano",
            f"{span.end_time_unix_nano} is before start_time_unix_nano "
            f"{span.start_time_unix_nano}: a span ends after it starts")
    for j, link in enumerate(span.links):
        if problem := _id_problem(link.trace_id, TRACE_ID_BYTES, "trace id", required=True):
            return Rejection(f"{where}.links[{j}].trace_id", problem)
        if problem := _id_problem(link.span_id, SPAN_ID_BYTES, "span id", required=True):
            return Rejection(f"{where}.links[{j}].span_id", problem)
    return None


def _id_problem(value: bytes, size: int, what: str, *, required: bool) -> str | None:
    if not value:
        return f"missing: a {what} is {size} bytes" if required else None
    if len(value) != size:
        return f"{len(value)} bytes, expected {size} (a W3C {what})"
    if not any(value):
        return f"all zero, which means no {what}: give a random non-zero one"
    return None


def attributes_of(pairs: Any) -> dict[str, Any]:
    """OTLP key-values as a JSON-able dict (a repeated key keeps its last value)."""
    found: dict[str, Any] = {}
    pair: KeyValue
    for pair in pairs:
        found[pair.key] = value_of(pair.value)
    return found


def value_of(value: AnyValue) -> Any:
    """One OTLP ``AnyValue`` as JSON: bytes become hex, an unset value None."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "bytes_value":
        return value.bytes_value.hex()
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return None
