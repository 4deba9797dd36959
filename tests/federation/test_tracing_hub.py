"""Traces across the federation, in-process with the SDK's in-memory exporter: a fleet plan
over two simulated members is one trace with spans of the hub and of both members, parented
hop by hop; a command sent again after a dropped session or a hub restart stays in the run's
trace; a workload's Jobs are traced once each, not once per dispatch tick; background work
(heartbeats, dispatch ticks) makes no spans."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from federation.api import common_pb2, fleet_pb2, member_pb2
from federation.client.channels import HubAddress
from federation.client.discovery import HubFiles, HubInfo
from federation.client.fleet import FleetClient
from federation.client.member import MemberLink
from federation.client.simulated import SimulatedMember
from federation.client.tracing import CLUSTER, COMMAND_ID, COMMAND_KIND, RESEND, RUN_ID
from federation.client.tracing import WORKLOAD_ID as WORKLOAD
from federation.hub.core import HubSettings
from federation.hub.server import ServeSettings, serve
from federation.telemetry import setup
from primitives import propagation
from tests.federation.hubs import GRACE, HEARTBEAT, RawMember, RunningHub

PLAN = json.dumps({"steps": [{"name": "xid", "target": {}, "fault": {"type": "GPUXid",
                                                                     "xid": 79}}]})
RUN_PLAN = "/fakefleet.federation.v1alpha1.FleetService/RunPlan"
SUBMIT = "/fakefleet.federation.v1alpha1.FleetService/SubmitWorkload"


class Spans:
    """One in-memory exporter behind a TracerProvider per process of the fleet (hub, each
    member's operator, the CLI), each with its own Resource, as ``setup.configure`` makes
    them, and none of them global."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.providers: list[TracerProvider] = []

    def provider(self, service: str, cluster: str | None = None) -> TracerProvider:
        provider = setup.configure(service, cluster, set_global=False)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.providers.append(provider)
        return provider

    def all(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def of_trace(self, trace_id: int) -> list[ReadableSpan]:
        return [span for span in self.all() if span.context.trace_id == trace_id]

    def named(self, name: str, spans: Sequence[ReadableSpan] | None = None,
              **attributes: object) -> list[ReadableSpan]:
        return [span for span in (self.all() if spans is None else spans)
                if span.name == name and all((span.attributes or {}).get(key) == value
                                             for key, value in attributes.items())]

    def one(self, name: str, spans: Sequence[ReadableSpan] | None = None,
            **attributes: object) -> ReadableSpan:
        found = self.named(name, spans, **attributes)
        assert len(found) == 1, f"{len(found)} spans {name} {attributes}: {found}"
        return found[0]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spans]:
    for name in list(os.environ):
        if name.startswith("OTEL_"):  # no exporter but ours
            monkeypatch.delenv(name)
    recorded = Spans()
    yield recorded
    for provider in recorded.providers:
        provider.shutdown()


def parent_of(child: ReadableSpan, parent: ReadableSpan) -> bool:
    return child.parent is not None and child.parent.span_id == parent.context.span_id \
        and child.context.trace_id == parent.context.trace_id


def span_id(traceparent: str) -> int:
    context = propagation.span_context(traceparent)
    assert context is not None, traceparent
    return context.span_id


def trace_id(traceparent: str) -> int:
    context = propagation.span_context(traceparent)
    assert context is not None, traceparent
    return context.trace_id


@contextlib.asynccontextmanager
async def traced_hub(state_dir: Path, provider: TracerProvider, *,
                     listen: str = "127.0.0.1:0") -> AsyncIterator[RunningHub]:
    """An in-process hub (as tests.federation.hubs.running_hub) tracing with ``provider``."""
    stop = asyncio.Event()
    ready: asyncio.Future[HubInfo] = asyncio.get_running_loop().create_future()
    settings = ServeSettings(hub=HubSettings(state_dir=state_dir, heartbeat_interval=HEARTBEAT,
                                             grace=GRACE, fsync=False), listen=listen)
    task = asyncio.create_task(serve(settings, stop_flag=stop, ready=ready.set_result,
                                     tracer_provider=provider))
    done, _ = await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    info = ready.result()
    try:
        yield RunningHub(info=info, key=HubFiles(state_dir).key.read_bytes(),
                         address=HubAddress(info.address))
    finally:
        stop.set()
        await task


async def eventually(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def _all_ready(hub: RunningHub, count: int) -> bool:
    async with hub.fleet() as fleet:
        members = await fleet.list_clusters()
    return len(members) == count and all(m.state == common_pb2.MEMBER_STATE_READY for m in members)


@contextlib.asynccontextmanager
async def linked(hub: RunningHub, spans: Spans,
                 members: Sequence[SimulatedMember]) -> AsyncIterator[None]:
    """The members' links running, each tracing as its own operator process would."""
    stop = asyncio.Event()
    tasks = []
    for member in members:
        provider = spans.provider("fakefleet-operator", member.name)
        member.link = MemberLink(hub.address, hub.member_token(member.name), member,
                                 member.name, tracer_provider=provider)
        tasks.append(asyncio.create_task(member.link.run(stop)))
    try:
        await eventually(lambda: _all_ready(hub, len(members)))
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for member in members:
            await member.stop()


async def _finished_run(fleet: FleetClient, run_id: str) -> fleet_pb2.Run:
    async with asyncio.timeout(10):
        async for run in fleet.watch_run(run_id):
            if run.phase != fleet_pb2.RUN_PHASE_RUNNING:
                return run
    raise AssertionError("the watch ended before the run finished")


# -- a fleet plan over two members -------------------------------------------------------------

async def test_a_fleet_plan_over_two_members_is_one_trace(tmp_path: Path, spans: Spans) -> None:
    members = [SimulatedMember(name, run_seconds=0.3) for name in ("east", "west")]
    cli = spans.provider("fakefleet-cli")
    async with traced_hub(tmp_path, spans.provider("fakefleet-hub")) as hub, \
            linked(hub, spans, members), \
            FleetClient(hub.address, hub.fleet_token, tracer_provider=cli) as fleet:
        with cli.get_tracer("test").start_as_current_span("cli.run") as root:
            run = await fleet.run_plan(PLAN, start_delay=0.2)
        finished = await _finished_run(fleet, run.id)  # outside the span: untraced
        assert finished.phase == fleet_pb2.RUN_PHASE_SUCCEEDED
    in_trace = spans.of_trace(root.get_span_context().trace_id)

    # The CLI's call, the hub's handling of it, the run, its fan-out.
    [client] = [s for s in spans.named(RUN_PLAN, in_trace) if s.kind is trace.SpanKind.CLIENT]
    assert client.resource.attributes["service.name"] == "fakefleet-cli"
    assert client.parent is not None
    assert client.parent.span_id == root.get_span_context().span_id
    [server] = [s for s in spans.named(RUN_PLAN, in_trace) if s.kind is trace.SpanKind.SERVER]
    assert parent_of(server, client)
    run_span = spans.one("fleet.run", in_trace)
    assert parent_of(run_span, server)
    assert run_span.attributes == {"fakefleet.run.name": "", "fakefleet.run.members": 2,
                                   RUN_ID: run.id}
    fanout = spans.one("hub.fanout", in_trace)
    assert parent_of(fanout, run_span)

    for member in members:
        cluster = member.name
        command_id = f"{run.id}/{cluster}/start"
        # The hub sends the command in a span whose context the message carries...
        send = spans.one("hub.send_command", in_trace, **{CLUSTER: cluster})
        assert parent_of(send, fanout)
        assert send.attributes == {CLUSTER: cluster, COMMAND_ID: command_id,
                                   COMMAND_KIND: "StartPlan", RUN_ID: run.id, RESEND: False}
        assert send.kind is trace.SpanKind.PRODUCER
        assert send.resource.attributes["service.name"] == "fakefleet-hub"
        # ...the member executes it as a child of that span, in its own process...
        execute = spans.one("member.execute_command", in_trace, **{CLUSTER: cluster})
        assert parent_of(execute, send)
        assert execute.resource.attributes["service.name"] == "fakefleet-operator"
        assert execute.resource.attributes["k8s.cluster.name"] == cluster
        assert (execute.attributes or {})[COMMAND_ID] == command_id
        # ...keeps that context with what it made for the command...
        assert span_id(member.executed[command_id].traceparent) == execute.context.span_id
        # ...and the hub takes the ack and every result in as children of it.
        ack = spans.one("hub.command_acknowledged", in_trace, **{CLUSTER: cluster})
        assert parent_of(ack, execute)
        results = spans.named("hub.command_result", in_trace, **{CLUSTER: cluster})
        assert results
        assert all(parent_of(result, execute) for result in results)
        assert [(r.attributes or {}).get("fakefleet.command.phase") for r in results][-1] == \
            "Succeeded"
        assert all(r.resource.attributes["service.name"] == "fakefleet-hub" for r in results)

    services = {span.resource.attributes["service.name"] for span in in_trace}
    assert services == {"fakefleet-cli", "fakefleet-hub", "fakefleet-operator"}
    clusters = {span.resource.attributes.get("k8s.cluster.name") for span in in_trace}
    assert clusters == {None, "east", "west"}
    # Nothing else made a span: no heartbeat, no dispatch tick; outside the run's trace there
    # are only the hub's spans of calls (sessions, registrations, the untraced watch).
    others = [span for span in spans.all() if span.context.trace_id != run_span.context.trace_id]
    assert others
    assert all(span.kind is trace.SpanKind.SERVER and span.name.startswith("/fakefleet.")
               for span in others), [span.name for span in others]


# -- commands sent again ------------------------------------------------------------------------

class Recording(RawMember):
    """A member speaking by hand that keeps each HubMessage with its command (and its
    ``traceparent``); hub heartbeats are skipped, not echoed."""

    async def next_message(self, timeout: float = 5.0) -> member_pb2.HubMessage:
        assert self.call is not None
        async with asyncio.timeout(timeout):
            while True:
                message = await self.call.read()
                assert message is not grpc.aio.EOF, "the hub ended the session"
                assert isinstance(message, member_pb2.HubMessage)
                if message.WhichOneof("kind") == "command":
                    return message


async def test_a_command_sent_again_after_the_session_dropped_stays_in_the_runs_trace(
        tmp_path: Path, spans: Spans) -> None:
    async with traced_hub(tmp_path, spans.provider("fakefleet-hub")) as hub, \
            hub.fleet() as fleet:
        member = Recording(hub, "west")
        await member.register()
        await member.hello()
        run = await fleet.run_plan(PLAN, start_delay=0)
        first = await member.next_message()
        await member.close()  # dropped before the ack: the hub sends it again
        member = Recording(hub, "west")
        await member.hello()
        again = await member.next_message()
        assert again.command.id == first.command.id
        # An ack with no context of its own: the hub takes it in within the command's trace.
        await member.send(member_pb2.MemberMessage(
            ack=member_pb2.CommandAck(command_id=again.command.id)))
        await eventually(lambda: _acknowledged(fleet, run.id))
        await member.close()
    run_span = spans.one("fleet.run")
    assert trace_id(first.traceparent) == trace_id(again.traceparent) == \
        run_span.context.trace_id
    first_send = spans.one("hub.send_command", **{RESEND: False})
    resend = spans.one("hub.send_command", **{RESEND: True})
    assert (first_send.context.span_id, resend.context.span_id) == (
        span_id(first.traceparent), span_id(again.traceparent))
    assert parent_of(first_send, spans.one("hub.fanout"))
    assert parent_of(resend, first_send)
    assert parent_of(spans.one("hub.command_acknowledged"), first_send)


async def _acknowledged(fleet: FleetClient, run_id: str) -> bool:
    run = await fleet.get_run(run_id)
    return run.members[0].state == fleet_pb2.MEMBER_RUN_STATE_ACKNOWLEDGED


async def test_a_restarted_hub_sends_a_command_again_in_the_runs_trace(
        tmp_path: Path, spans: Spans) -> None:
    provider = spans.provider("fakefleet-hub")
    async with traced_hub(tmp_path, provider) as hub, hub.fleet() as fleet:
        member = Recording(hub, "west")
        await member.register()
        await member.hello()
        run = await fleet.run_plan(PLAN, start_delay=0)
        first = await member.next_message()
        await member.close()
    stored = json.loads((tmp_path / "state.json").read_text())
    [kept] = stored["runs"]
    assert kept["traceparent"]
    assert kept["parts"][0]["traceparent"] == first.traceparent
    async with traced_hub(tmp_path, provider) as hub:
        member = Recording(hub, "west")
        await member.register()
        await member.hello()
        again = await member.next_message()
        # The member executes it in a span of its own, and says so in its ack.
        member_tracer = spans.provider("fakefleet-operator", "west").get_tracer("test")
        with member_tracer.start_as_current_span(
                "member.execute_command", context=propagation.parent(again.traceparent)):
            executed = propagation.traceparent()
        await member.send(member_pb2.MemberMessage(
            ack=member_pb2.CommandAck(command_id=again.command.id), traceparent=executed))
        async with hub.fleet() as fleet:
            await eventually(lambda: _acknowledged(fleet, run.id))
        await member.close()
    run_span = spans.one("fleet.run")
    assert kept["traceparent"] == propagation.traceparent(_as_span(run_span))
    assert again.command.id == first.command.id
    assert trace_id(again.traceparent) == run_span.context.trace_id
    resend = spans.one("hub.send_command", **{RESEND: True})
    assert parent_of(resend, spans.one("hub.send_command", **{RESEND: False}))
    assert resend.context.span_id == span_id(again.traceparent)
    ack = spans.one("hub.command_acknowledged")
    assert parent_of(ack, spans.one("member.execute_command"))
    assert ack.context.trace_id == run_span.context.trace_id


def _as_span(span: ReadableSpan) -> trace.Span:
    assert span.context is not None
    return trace.NonRecordingSpan(span.context)


# -- workloads ----------------------------------------------------------------------------------

async def test_each_job_of_a_workload_is_sent_in_the_workloads_trace_once(
        tmp_path: Path, spans: Spans) -> None:
    member = SimulatedMember("west")
    cli = spans.provider("fakefleet-cli")
    spec = fleet_pb2.WorkloadSpec(
        jobs=3, pods_per_job=1, resources={"nvidia.com/gpu": "8"},
        run_time=fleet_pb2.RunTimeDistribution(distribution="fixed", seconds=0.3),
        arrivals=fleet_pb2.ArrivalProcess(process="rate", rate=20), seed=1,
        target=fleet_pb2.WorkloadTarget(placement="spread"))
    async with traced_hub(tmp_path, spans.provider("fakefleet-hub")) as hub, \
            linked(hub, spans, [member]), \
            FleetClient(hub.address, hub.fleet_token, tracer_provider=cli) as fleet:
        with cli.get_tracer("test").start_as_current_span("cli.submit") as root:
            workload = await fleet.submit_workload(spec, start_delay=0.1)
        async with asyncio.timeout(10):
            async for seen in fleet.watch_workload(workload.id):
                if seen.phase != fleet_pb2.WORKLOAD_PHASE_RUNNING:
                    break
        assert seen.phase == fleet_pb2.WORKLOAD_PHASE_SUCCEEDED
        await asyncio.sleep(1.0)  # a few more dispatch ticks
    in_trace = spans.of_trace(root.get_span_context().trace_id)
    [server] = [s for s in spans.named(SUBMIT, in_trace) if s.kind is trace.SpanKind.SERVER]
    workload_span = spans.one("fleet.workload", in_trace)
    assert parent_of(workload_span, server)
    assert (workload_span.attributes or {})[WORKLOAD] == workload.id
    sends = spans.named("hub.send_command")
    assert len(sends) == 3, "one span per Job sent, none per dispatch tick"
    for index, send in enumerate(sorted(sends, key=lambda s: s.start_time or 0)):
        command_id = f"{workload.id}/west/job-{index}-1"
        assert send.attributes == {CLUSTER: "west", COMMAND_ID: command_id,
                                   COMMAND_KIND: "CreateJob", WORKLOAD: workload.id,
                                   RESEND: False}
        assert parent_of(send, workload_span)
        execute = spans.one("member.execute_command", **{COMMAND_ID: command_id})
        assert parent_of(execute, send)
        for taken in spans.named("hub.command_result", **{COMMAND_ID: command_id}):
            assert parent_of(taken, execute)
