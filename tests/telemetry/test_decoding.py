"""From OTLP requests to stored rows and rejections: pure, no collector."""

from __future__ import annotations

import json

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from federation.telemetry.decoding import AHEAD_NS, UNKNOWN_SERVICE, decode

TRACE = b"\x0a" * 16
T0 = 1_780_000_000 * 10**9
#: The collector's clock: an hour after the spans.
NOW = T0 + 3600 * 10**9
#: 2100-01-01T00:00:00Z.
Y2100 = 4_102_444_800 * 10**9


def kv(key: str, **value: object) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(**value))  # type: ignore[arg-type]


def one(span: Span, resource: list[KeyValue] | None = None) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=resource or []),
        scope_spans=[ScopeSpans(scope=InstrumentationScope(name="fakefleet.test"),
                                spans=[span])])])


def test_a_span_becomes_a_row_with_its_resource_and_attributes_as_json() -> None:
    span = Span(
        trace_id=TRACE, span_id=b"\x01" * 8, parent_span_id=b"\x02" * 8, name="inject",
        kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=T0, end_time_unix_nano=T0 + 5,
        status=Status(code=Status.STATUS_CODE_ERROR, message="Xid 79"),
        attributes=[kv("nodes", int_value=3), kv("ratio", double_value=0.5),
                    kv("dry", bool_value=False), kv("raw", bytes_value=b"\x01\xff"),
                    kv("zones", array_value=ArrayValue(values=[AnyValue(string_value="a")])),
                    kv("nested", kvlist_value=KeyValueList(values=[kv("k", string_value="v")])),
                    kv("unset")],
        events=[Span.Event(time_unix_nano=T0 + 1, name="taint",
                           attributes=[kv("node", string_value="n-0")])],
        links=[Span.Link(trace_id=b"\x0b" * 16, span_id=b"\x03" * 8,
                         attributes=[kv("why", string_value="reconcile")])])
    decoded = decode(one(span, [kv("service.name", string_value="fakefleet-engine"),
                                kv("k8s.cluster.name", string_value="west")]), now_ns=NOW)
    assert decoded.rejections == []
    (row,) = decoded.rows
    assert (row.trace_id, row.span_id, row.parent_span_id) == ("0a" * 16, "01" * 8, "02" * 8)
    assert (row.service, row.cluster, row.scope, row.name) == (
        "fakefleet-engine", "west", "fakefleet.test", "inject")
    assert (row.start_ns, row.end_ns, row.status_code, row.status_message) == (
        T0, T0 + 5, 2, "Xid 79")
    assert json.loads(row.attributes) == {
        "nodes": 3, "ratio": 0.5, "dry": False, "raw": "01ff", "zones": ["a"],
        "nested": {"k": "v"}, "unset": None}
    assert json.loads(row.resource) == {"service.name": "fakefleet-engine",
                                        "k8s.cluster.name": "west"}
    assert json.loads(row.events) == [{"name": "taint", "time_ns": T0 + 1,
                                       "attributes": {"node": "n-0"}}]
    assert json.loads(row.links) == [{"trace_id": "0b" * 16, "span_id": "03" * 8,
                                      "attributes": {"why": "reconcile"}}]


def test_a_root_span_of_an_unnamed_service_gets_the_sdk_default() -> None:
    (row,) = decode(one(Span(trace_id=TRACE, span_id=b"\x01" * 8, start_time_unix_nano=T0,
                             end_time_unix_nano=T0)), now_ns=NOW).rows
    assert (row.parent_span_id, row.service, row.cluster) == (None, UNKNOWN_SERVICE, None)


def test_the_cluster_may_come_from_the_span_when_the_resource_has_none() -> None:
    span = Span(trace_id=TRACE, span_id=b"\x01" * 8, start_time_unix_nano=T0,
                end_time_unix_nano=T0, attributes=[kv("k8s.cluster.name", string_value="east")])
    assert decode(one(span), now_ns=NOW).rows[0].cluster == "east"


def test_bad_links_and_impossible_times_are_refused_with_their_field() -> None:
    base = {"trace_id": TRACE, "span_id": b"\x01" * 8, "start_time_unix_nano": T0,
            "end_time_unix_nano": T0}
    cases = [
        (Span(**base, links=[Span.Link(trace_id=b"\x01" * 3, span_id=b"\x01" * 8)]),  # type: ignore[arg-type]
         "links[0].trace_id: 3 bytes, expected 16"),
        (Span(**base, links=[Span.Link(trace_id=TRACE)]),  # type: ignore[arg-type]
         "links[0].span_id: missing"),
        (Span(trace_id=TRACE, span_id=b"\x01" * 8, start_time_unix_nano=T0,
              end_time_unix_nano=2**64 - 1),
         "end_time_unix_nano: 18446744073709551615 is 16666740474s ahead"),
    ]
    for span, expected in cases:
        decoded = decode(one(span), now_ns=NOW)
        assert decoded.rows == []
        assert f"resource_spans[0].scope_spans[0].spans[0].{expected}" in decoded.summary()


def test_a_summary_of_many_rejections_stays_short() -> None:
    spans = [Span(trace_id=TRACE, span_id=b"", start_time_unix_nano=T0, end_time_unix_nano=T0)
             for _ in range(10)]
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])])
    summary = decode(request, now_ns=NOW).summary()
    assert summary.count("span_id: missing") == 3
    assert summary.endswith("; and 7 more")


def test_a_span_that_names_its_cluster_overrides_its_process_cluster() -> None:
    span = Span(trace_id=TRACE, span_id=b"\x01" * 8, start_time_unix_nano=T0,
                end_time_unix_nano=T0, attributes=[kv("k8s.cluster.name", string_value="east")])
    decoded = decode(one(span, [kv("k8s.cluster.name", string_value="west")]), now_ns=NOW)
    assert decoded.rows[0].cluster == "east"


def test_spans_dated_far_past_the_collectors_clock_are_refused() -> None:
    """A span of 2100 would outlive every real trace; a sender's clock a little ahead is
    fine."""
    spans = [
        Span(trace_id=TRACE, span_id=b"\x01" * 8, start_time_unix_nano=Y2100,
             end_time_unix_nano=Y2100 + 1),
        Span(trace_id=TRACE, span_id=b"\x02" * 8, start_time_unix_nano=NOW,
             end_time_unix_nano=NOW + AHEAD_NS + 10**9),
        Span(trace_id=TRACE, span_id=b"\x03" * 8, start_time_unix_nano=NOW,
             end_time_unix_nano=NOW + AHEAD_NS),
    ]
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])])
    decoded = decode(request, now_ns=NOW)
    assert [row.span_id for row in decoded.rows] == ["03" * 8]
    assert [str(r) for r in decoded.rejections] == [
        f"resource_spans[0].scope_spans[0].spans[0].start_time_unix_nano: {Y2100} is "
        f"2322441200s ahead of the collector's clock, more than 600s: give ns since the "
        f"epoch, and set the sender's clock right",
        f"resource_spans[0].scope_spans[0].spans[1].end_time_unix_nano: "
        f"{NOW + AHEAD_NS + 10**9} is 601s ahead of the collector's clock, more than 600s: give "
        f"ns since the epoch, and set the sender's clock right",
    ]
