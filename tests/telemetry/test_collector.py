"""The collector in-process on a free loopback port, fed by the real SDK's OTLP exporter and by
hand-made requests; `fakefleet trace` reading what it stored."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace as trace_api
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags

from federation.telemetry.collector import SERVICE
from federation.telemetry.decoding import SpanRow
from federation.telemetry.files import CollectorFiles, CollectorInfo
from federation.telemetry.store import Retention, SpanStore
from operators.cli.traces import trace
from tests.telemetry.collectors import flush, provider, running_collector

T0 = 1_780_000_000 * 10**9
MS = 10**6


def cli(state_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(trace, [*args, "--state-dir", str(state_dir)])
    assert result.exit_code == 0, result.output
    return result.output


def otlp_span(trace_id: bytes, span_id: bytes, name: str, start: int, end: int,
              parent: bytes = b"") -> Span:
    return Span(trace_id=trace_id, span_id=span_id, parent_span_id=parent, name=name,
                start_time_unix_nano=start, end_time_unix_nano=end)


def request(*spans: Span, service: str = "hand-made") -> ExportTraceServiceRequest:
    resource = Resource(attributes=[
        KeyValue(key="service.name", value=AnyValue(string_value=service))])
    return ExportTraceServiceRequest(resource_spans=[
        ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=list(spans))])])


async def export(info: CollectorInfo, body: ExportTraceServiceRequest
                 ) -> ExportTraceServiceResponse:
    async with grpc.aio.insecure_channel(info.address) as channel:
        return await TraceServiceStub(channel).Export(body, timeout=5)  # type: ignore[no-any-return,no-untyped-call]


async def fleet_trace(info: CollectorInfo) -> str:
    """Spans of one fleet-wide trace from three processes, with fixed times: a hub fan-out,
    a member's execution under it, an engine's span linked to that execution, and an engine
    batch whose parent never reaches the collector."""
    hub = provider(info, "fakefleet-hub")
    west = provider(info, "fakefleet-operator", cluster="west")
    east = provider(info, "fakefleet-engine", cluster="east")
    root = hub.get_tracer("test").start_span("fleet.run", start_time=T0)
    fanout = hub.get_tracer("test").start_span(
        "hub.fanout", context=trace_api.set_span_in_context(root), start_time=T0 + 1 * MS)
    member = west.get_tracer("test").start_span(
        "member.execute", context=trace_api.set_span_in_context(fanout),
        start_time=T0 + 5 * MS, attributes={"fakefleet.step": "xid"})
    member.end(end_time=T0 + 25 * MS)
    fanout.end(end_time=T0 + 30 * MS)
    inject = east.get_tracer("test").start_span(
        "engine.inject", context=trace_api.set_span_in_context(root), start_time=T0 + 40 * MS,
        links=[Link(member.get_span_context())])
    inject.end(end_time=T0 + 90 * MS)
    unexported = NonRecordingSpan(SpanContext(
        root.get_span_context().trace_id, 0xDEAD0000BEEF0000, is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    batch = east.get_tracer("test").start_span(
        "engine.batch", context=trace_api.set_span_in_context(unexported),
        start_time=T0 + 50 * MS)
    batch.end(end_time=T0 + 60 * MS)
    root.end(end_time=T0 + 100 * MS)
    await flush([hub, west, east])
    return f"{root.get_span_context().trace_id:032x}"


async def test_sdk_spans_arrive_and_show_as_a_tree(tmp_path: Path) -> None:
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        trace_id = await fleet_trace(info)
        listed = json.loads(cli(tmp_path, "ls", "-o", "json"))
        shown = json.loads(cli(tmp_path, "show", trace_id[:10], "-o", "json"))
        table = cli(tmp_path, "show", trace_id)
        listing = cli(tmp_path, "ls")

    assert listed == [{
        "traceId": trace_id, "root": "fleet.run", "firstSpan": "fleet.run",
        "services": ["fakefleet-engine", "fakefleet-hub", "fakefleet-operator"],
        "clusters": ["east", "west"], "spans": 5, "startNs": T0, "durationNs": 100 * MS}]
    rows = [(s["name"], s["depth"], s["orphan"], s["offsetNs"] // MS, s["durationNs"] // MS,
             s["service"], s["cluster"]) for s in shown["spans"]]
    assert rows == [
        ("fleet.run", 0, False, 0, 100, "fakefleet-hub", None),
        ("hub.fanout", 1, False, 1, 29, "fakefleet-hub", None),
        ("member.execute", 2, False, 5, 20, "fakefleet-operator", "west"),
        ("engine.inject", 1, False, 40, 50, "fakefleet-engine", "east"),
        ("engine.batch", 0, True, 50, 10, "fakefleet-engine", "east"),
    ]
    member = shown["spans"][2]
    assert member["attributes"] == {"fakefleet.step": "xid"}
    assert shown["spans"][3]["links"] == [
        {"trace_id": trace_id, "span_id": member["spanId"], "attributes": {}}]
    assert shown["spans"][4]["parentSpanId"] == "dead0000beef0000"

    assert "│  └─ member.execute" in table
    assert "└─ engine.inject" in table
    assert f"↪ link to span {member['spanId']} of this trace (member.execute)" in table
    assert "engine.batch  ⚠ parent dead0000beef0000 missing" in table
    assert "+40.0ms" in table
    assert "50.0ms" in table
    for expected in (trace_id, "fleet.run", "east, west", "5", "100.0ms"):
        assert expected in listing


async def test_collector_publishes_its_address_and_health(tmp_path: Path) -> None:
    files = CollectorFiles(tmp_path)
    async with running_collector(tmp_path) as info:
        assert CollectorInfo.read(files.info) == info
        assert info.pid == os.getpid()
        async with grpc.aio.insecure_channel(info.address) as channel:
            stub: Any = health_pb2_grpc.HealthStub(channel)  # its stubs lack the methods
            for service in ("", SERVICE):
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert not files.info.exists()


async def test_garbage_bytes_are_refused_and_the_collector_keeps_serving(
        tmp_path: Path) -> None:
    async with running_collector(tmp_path) as info:
        async with grpc.aio.insecure_channel(info.address) as channel:
            raw = channel.unary_unary(f"/{SERVICE}/Export", request_serializer=lambda b: b,
                                      response_deserializer=ExportTraceServiceResponse.FromString)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw(b"\xff\xff\xff\xff not protobuf", timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not an OTLP ExportTraceServiceRequest" in str(refused.value.details())
        good = otlp_span(b"\x01" * 16, b"\x02" * 8, "after", T0, T0 + MS)
        assert await export(info, request(good)) == ExportTraceServiceResponse()


@pytest.mark.parametrize(("span", "field", "problem"), [
    (otlp_span(b"\x01" * 15, b"\x02" * 8, "short", T0, T0 + 1), "trace_id",
     "15 bytes, expected 16"),
    (otlp_span(b"\x01" * 16, b"\x02" * 9, "long", T0, T0 + 1), "span_id",
     "9 bytes, expected 8"),
    (otlp_span(b"", b"\x02" * 8, "none", T0, T0 + 1), "trace_id", "missing"),
    (otlp_span(b"\x01" * 16, b"\x00" * 8, "zero", T0, T0 + 1), "span_id", "all zero"),
    (otlp_span(b"\x01" * 16, b"\x02" * 8, "parent", T0, T0 + 1, parent=b"\x03" * 4),
     "parent_span_id", "4 bytes, expected 8"),
    (otlp_span(b"\x01" * 16, b"\x02" * 8, "backwards", T0 + 5, T0), "end_time_unix_nano",
     "is before start_time_unix_nano"),
    (otlp_span(b"\x01" * 16, b"\x02" * 8, "unstarted", 0, 0), "start_time_unix_nano",
     "missing"),
])
async def test_malformed_spans_are_refused_naming_the_field(
        tmp_path: Path, span: Span, field: str, problem: str) -> None:
    async with running_collector(tmp_path) as info:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await export(info, request(span))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = str(refused.value.details())
        assert f"resource_spans[0].scope_spans[0].spans[0].{field}: " in details
        assert problem in details
        good = otlp_span(b"\x01" * 16, b"\x04" * 8, "after", T0, T0 + MS)
        assert await export(info, request(good)) == ExportTraceServiceResponse()


async def test_a_partly_bad_batch_stores_the_good_spans_and_says_which_were_refused(
        tmp_path: Path) -> None:
    good = otlp_span(b"\x01" * 16, b"\x02" * 8, "good", T0, T0 + MS)
    bad = otlp_span(b"\x01" * 16, b"\x03" * 8, "bad", T0 + MS, T0)
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        answer = await export(info, request(good, bad))
    assert answer.partial_success.rejected_spans == 1
    assert "1 span(s) stored, 1 refused: resource_spans[0].scope_spans[0].spans[1]." \
           "end_time_unix_nano" in answer.partial_success.error_message
    shown = json.loads(cli(tmp_path, "show", "01" * 16, "-o", "json"))
    assert [s["name"] for s in shown["spans"]] == ["good"]


async def test_spans_dated_in_2100_are_refused_and_counted_in_the_partial_success(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    y2100 = 4_102_444_800 * 10**9
    good = otlp_span(b"\x01" * 16, b"\x02" * 8, "good", T0, T0 + MS)
    future = [otlp_span(b"\x02" * 16, bytes([i + 1]) * 8, "future", y2100, y2100 + MS)
              for i in range(2)]
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        answer = await export(info, request(good, *future))
    assert answer.partial_success.rejected_spans == 2
    assert "1 span(s) stored, 2 refused: resource_spans[0].scope_spans[0].spans[1]." \
           "start_time_unix_nano: 4102444800000000000 is " in answer.partial_success.error_message
    assert "s ahead of the collector's clock, more than 600s" \
           in answer.partial_success.error_message
    assert "refused 2 span(s) of a batch" in caplog.text
    assert [t["root"] for t in json.loads(cli(tmp_path, "ls", "-o", "json"))] == ["good"]


async def test_a_retried_batch_is_stored_once(tmp_path: Path) -> None:
    spans = [otlp_span(b"\x01" * 16, bytes([i + 1]) * 8, f"s{i}", T0 + i, T0 + 10)
             for i in range(3)]
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        await export(info, request(*spans))
        await export(info, request(*spans[1:]))  # the answer was lost: the exporter retries
    listed = json.loads(cli(tmp_path, "ls", "-o", "json"))
    assert [(t["spans"], t["durationNs"]) for t in listed] == [(3, 10)]


async def test_spans_survive_a_restart_and_are_readable_while_it_is_down(
        tmp_path: Path) -> None:
    root = CollectorFiles.of(tmp_path).directory
    async with running_collector(root) as info:
        first = await fleet_trace(info)
        address = info.address
    assert json.loads(cli(tmp_path, "ls", "-o", "json"))[0]["traceId"] == first
    async with running_collector(root, listen=address) as info:
        assert info.address == address
        await export(info, request(otlp_span(b"\x07" * 16, b"\x01" * 8, "later", T0 + 10**9,
                                             T0 + 2 * 10**9)))
        listed = json.loads(cli(tmp_path, "ls", "-o", "json"))
    assert [(t["traceId"], t["spans"]) for t in listed] == [("07" * 16, 1), (first, 5)]


async def test_retention_drops_the_oldest_traces_periodically(tmp_path: Path) -> None:
    """Three traces of two spans each, a limit of four spans: the oldest trace goes, whole."""
    async with running_collector(CollectorFiles.of(tmp_path).directory,
                                 retention=Retention(max_spans=4, max_age_ns=10**20),
                                 retention_interval=0.1) as info:
        for i in range(3):
            trace_id = bytes([i + 1]) * 16
            await export(info, request(
                otlp_span(trace_id, b"\x01" * 8, f"root{i}", T0 + i * MS, T0 + i * MS + 5),
                otlp_span(trace_id, b"\x02" * 8, f"child{i}", T0 + i * MS + 1, T0 + i * MS + 2,
                          parent=b"\x01" * 8)))
        for _ in range(100):
            listed = json.loads(cli(tmp_path, "ls", "-o", "json"))
            if len(listed) < 3:
                break
            await asyncio.sleep(0.05)
    assert [t["root"] for t in listed] == ["root2", "root1"]


async def test_retention_drops_traces_that_ended_too_long_ago(tmp_path: Path) -> None:
    now = time.time_ns()
    async with running_collector(CollectorFiles.of(tmp_path).directory,
                                 retention=Retention(max_age_ns=3600 * 10**9),
                                 retention_interval=0.1) as info:
        await export(info, request(
            otlp_span(b"\x01" * 16, b"\x01" * 8, "yesterday", now - 86400 * 10**9,
                      now - 86000 * 10**9),
            otlp_span(b"\x02" * 16, b"\x01" * 8, "just now", now - 10**9, now)))
        for _ in range(100):
            listed = json.loads(cli(tmp_path, "ls", "-o", "json"))
            if len(listed) < 2:
                break
            await asyncio.sleep(0.05)
    assert [t["root"] for t in listed] == ["just now"]


async def test_trace_ids_that_match_nothing_or_several_are_explained(tmp_path: Path) -> None:
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        await export(info, request(
            otlp_span(bytes.fromhex("ab" * 16), b"\x01" * 8, "one", T0, T0 + 1),
            otlp_span(bytes.fromhex("ac" * 16), b"\x01" * 8, "two", T0, T0 + 1)))
    runner = CliRunner()
    for argument, message in [("a", "'a' starts 2 traces"), ("ff", "no trace starts with 'ff'"),
                              ("xyz", "'xyz' is not a trace id")]:
        result = runner.invoke(trace, ["show", argument, "--state-dir", str(tmp_path)])
        assert result.exit_code == 1
        assert message in " ".join(result.output.split())


def test_listing_without_a_store_says_how_to_get_one(tmp_path: Path) -> None:
    result = CliRunner().invoke(trace, ["ls", "--state-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "no span store" in result.output
    assert "fakefleet up" in result.output


async def test_a_batch_the_store_cannot_take_is_refused_as_retryable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk must not look like success (the exporter would drop the batch): the
    answer is UNAVAILABLE, which OTLP exporters retry, and the collector keeps serving."""
    original = SpanStore.write

    def full(self: SpanStore, rows: list[SpanRow]) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    good = otlp_span(b"\x01" * 16, b"\x02" * 8, "kept", T0, T0 + MS)
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        monkeypatch.setattr(SpanStore, "write", full)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await export(info, request(good))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "database or disk is full" in str(refused.value.details())
        monkeypatch.setattr(SpanStore, "write", original)
        assert await export(info, request(good)) == ExportTraceServiceResponse()
    assert json.loads(cli(tmp_path, "ls", "-o", "json"))[0]["root"] == "kept"
