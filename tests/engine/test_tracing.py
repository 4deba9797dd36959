"""Traces of the engine, made by the real SDK into memory over in-memory API servers: requests
carry ``traceparent`` only inside a sampled span; a fault's writes on many objects of one trace
context are one ``engine.fault_batch`` span, a child of the entries' context, and its writes
carry that span's context; default lifecycles and untraced entries make no span and send no
``traceparent``."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from operators.engine import tracing
from operators.k8s.client import Client
from operators.k8s.requests import Request
from primitives import propagation
from tests.engine.harness import LEASES, NODES, PODS, POOLS, Fleet, entry, pod, pool
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

XID = [{"name": "fault-xid", "resource": "Node",
        "selector": {"matchExpressions": [{"key": "conditions[GPUHealthy]", "operator": "NotIn",
                                           "values": ["False"]}]},
        "effect": {"conditions": [{"type": "GPUHealthy", "status": "False", "reason": "Xid79",
                                   "message": "GPU has fallen off the bus"}],
                   "taints": [{"key": "fakefleet.dev/gpu-xid", "value": "79",
                               "effect": "NoExecute"}],
                   "allocatable": {"nvidia.com/gpu": "7"}}}]
XID_RECOVER = [{"name": "fault-recover", "resource": "Node",
                "effect": {"conditions": [{"type": "GPUHealthy", "status": "True",
                                           "reason": "GPUReset"}],
                           "removeTaints": ["fakefleet.dev/gpu-xid"],
                           "allocatable": {"nvidia.com/gpu": None}, "endFault": True}}]
EXIT = [{"name": "fault-exit", "resource": "Pod", "selector": {"phases": ["Running"]},
         "effect": {"exit": {"exitCode": 3, "reason": "Error"}, "endFault": True}}]
END = [{"name": "fault-end", "resource": "Pod", "effect": {"endFault": True}}]


class Spans:
    """An SDK TracerProvider of the test's own (the global one stays unset), keeping finished
    spans in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def batches(self) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans()
                if span.name == tracing.BATCH]

    def step(self, name: str = "faultplan.inject") -> tuple[str, trace.SpanContext]:
        """A plan step's span, ended: its traceparent (as its entries carry it), its context."""
        with self.tracer.start_as_current_span(name) as span:
            return propagation.traceparent(), span.get_span_context()


def traceparent_of(span: ReadableSpan) -> str:
    """The span's context as a request carries it: flags "sampled" alone."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-01"


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def header(request: Request) -> str | None:
    return dict(request.headers).get("traceparent")


def gpu_fleet(replicas: int) -> Fleet:
    fleet = Fleet()
    fleet.host.put(POOLS, pool("gpu", replicas=replicas, gpu={"preset": "H100-SXM5-80GB"}))
    return fleet


# -- the HTTP client --------------------------------------------------------------------------

async def test_requests_in_a_sampled_span_carry_its_traceparent_and_no_others_do() -> None:
    spans = Spans()
    clock = FakeClock()
    api = MemoryTransport(clock)
    client = Client(api, clock=clock)
    await client.get("/version")
    with spans.tracer.start_as_current_span("work") as span:
        await client.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                    "metadata": {"name": "n"}})
        await client.get_text("/version")
        async for _ in client.watch(NODES, timeout_seconds=0):
            break
    unsampled = trace.NonRecordingSpan(trace.SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
        trace_flags=trace.TraceFlags(0)))
    with trace.use_span(unsampled):
        await client.get(f"{NODES}/n")
    await client.get(f"{NODES}/n")
    # As the SDK renders it, with the "random" flag (-03) that Go's propagator at
    # kube-apiserver 1.36 refuses: sent with "sampled" (-01) alone.
    rendered = propagation.traceparent(span)
    expected = f"{rendered[:-2]}01"
    assert [header(request) for request in api.requests] == [
        None, expected, expected, expected, None, None]


# -- fault batches ----------------------------------------------------------------------------

async def test_a_fault_on_two_nodes_of_one_trace_is_one_span_whose_writes_carry_it() -> None:
    spans = Spans()
    fleet = gpu_fleet(3)
    async with fleet.running(fleet.engine(tracer=spans.tracer)):
        await fleet.clock.advance(2)
        traced, step = spans.step()
        fleet.member.requests.clear()
        fleet.inject(entry("ns/plan/xid/0", XID, XID_RECOVER, traceparent=traced),
                     "gpu-0", "gpu-1")
        fleet.inject(entry("ns/untraced/xid/0", XID, XID_RECOVER), "gpu-2")
        await fleet.clock.advance(1)
        assert fleet.member.object(f"{NODES}/gpu-2")["spec"]["taints"], "injected untraced"
        [batch] = spans.batches()
        sent = list(fleet.member.requests)
    assert batch.parent is not None
    assert (batch.parent.trace_id, batch.parent.span_id) == (step.trace_id, step.span_id)
    assert attributes(batch) == {
        "k8s.cluster.name": "west", "fakefleet.objects": 2, "fakefleet.steps": 2,
        "fakefleet.kinds": ("Node",), "fakefleet.stages": ("fault-xid",),
        "fakefleet.entries": ("ns/plan/xid/0",)}
    assert batch.status.status_code is trace.StatusCode.UNSET
    ours = traceparent_of(batch)
    for request in sent:
        written = request.method == "PATCH" and "annotations" not in request.json().get(
            "metadata", {}) and request.path in {
            f"{NODES}/{name}{sub}" for name in ("gpu-0", "gpu-1") for sub in ("", "/status")}
        assert header(request) == (ours if written else None), (request.method, request.path)
    assert sum(1 for request in sent if header(request)) == 4, "status and taints, per node"


async def test_the_recovery_of_another_step_is_a_batch_of_its_own_under_that_step() -> None:
    spans = Spans()
    fleet = gpu_fleet(2)
    async with fleet.running(fleet.engine(tracer=spans.tracer)):
        await fleet.clock.advance(2)
        injected, _ = spans.step()
        fleet.inject(entry("ns/plan/xid/0", XID, XID_RECOVER, traceparent=injected),
                     "gpu-0", "gpu-1")
        await fleet.clock.advance(1)
        recovered, recovery = spans.step("faultplan.recover")
        await fleet.recover("ns/plan/xid/0", recovered)
        await fleet.clock.advance(1)
    first, second = spans.batches()
    assert parent_id(second) == recovery.span_id
    assert attributes(second)["fakefleet.stages"] == ("fault-recover",)
    assert attributes(second)["fakefleet.objects"] == 2
    assert attributes(first)["fakefleet.stages"] == ("fault-xid",)


async def test_pods_of_one_trace_are_one_batch_and_their_default_lifecycle_is_untraced(
) -> None:
    spans = Spans()
    fleet = Fleet()
    fleet.host.put(POOLS, pool("cpu", replicas=1))
    async with fleet.running(fleet.engine(tracer=spans.tracer)):
        await fleet.clock.advance(1)
        for name in ("a", "b"):
            fleet.member.put(PODS, pod(name, "cpu-0"))
        await fleet.clock.advance(1)
        assert fleet.pod("a")["status"]["phase"] == "Running"
        assert spans.batches() == [], "the default lifecycle makes no span"
        traced, step = spans.step()
        fleet.inject(entry("ns/plan/exit/0", EXIT, END, traceparent=traced), "a", "b",
                     kind="Pod")
        await fleet.clock.advance(1)
        [batch] = spans.batches()
        sent = list(fleet.member.requests)
    assert parent_id(batch) == step.span_id
    assert attributes(batch)["fakefleet.objects"] == 2
    assert attributes(batch)["fakefleet.kinds"] == ("Pod",)
    assert attributes(batch)["fakefleet.stages"] == ("fault-exit",)
    ours = traceparent_of(batch)
    exits = [request for request in sent if request.method == "PATCH"
             and request.path.startswith(PODS) and header(request) == ours]
    assert {request.path for request in exits} == {
        f"{PODS}/{name}/status" for name in ("a", "b")}, "the exit's status write, per pod"
    assert all(header(request) is None for request in sent if request not in exits)


async def test_untraced_entries_and_heartbeats_make_no_span_and_send_no_traceparent() -> None:
    spans = Spans()
    fleet = gpu_fleet(2)
    async with fleet.running(fleet.engine(tracer=spans.tracer)):
        await fleet.clock.advance(2)
        fleet.inject(entry("ns/plan/xid/0", XID, XID_RECOVER), "gpu-0")
        await fleet.clock.advance(120)
        assert fleet.member.sent("PATCH", f"{LEASES}/gpu-0"), "renewed meanwhile"
    assert spans.exporter.get_finished_spans() == ()
    assert all(not request.headers for request in fleet.member.requests)


async def test_a_failed_write_marks_its_batch_and_the_retry_is_another_batch() -> None:
    spans = Spans()
    fleet = gpu_fleet(1)
    async with fleet.running(fleet.engine(tracer=spans.tracer)):
        await fleet.clock.advance(2)
        traced, _ = spans.step()
        fleet.member.fail("PATCH", f"{NODES}/gpu-0/status", status=500, reason="InternalError")
        fleet.inject(entry("ns/plan/xid/0", XID, XID_RECOVER, traceparent=traced), "gpu-0")
        await fleet.clock.advance(5)
        assert fleet.member.object(f"{NODES}/gpu-0")["spec"]["taints"]
    failed, retried = spans.batches()
    assert failed.status.status_code is trace.StatusCode.ERROR
    assert attributes(failed)["fakefleet.failed_steps"] == 1
    assert [event.name for event in failed.events] == ["exception"]
    assert retried.status.status_code is trace.StatusCode.UNSET
    assert parent_id(retried) == parent_id(failed) is not None


async def test_a_batch_still_open_when_the_engine_stops_is_ended() -> None:
    spans = Spans()
    fleet = gpu_fleet(1)
    async with fleet.running(fleet.engine(tracer=spans.tracer)):
        await fleet.clock.advance(2)
        traced, _ = spans.step()
        fleet.inject(entry("ns/plan/xid/0", XID, XID_RECOVER, traceparent=traced), "gpu-0")
        await fleet.clock.advance(tracing.LINGER / 10)
        assert spans.batches() == [], "still lingering"
    assert len(spans.batches()) == 1


async def test_a_long_fault_is_a_batch_per_burst_not_one_span_for_all_of_it() -> None:
    """Steps of one trace context further apart than ``longest`` open a new batch."""
    spans = Spans()
    clock = FakeClock()
    batches = tracing.FaultBatches("west", clock=clock, tracer=spans.tracer, linger=1.0,
                                   longest=2.0)
    traced, _ = spans.step()
    for second in range(6):  # a step every 0.5 s: never idle for the linger
        with batches.writing(traced, kind="Pod", name=f"default/p{second}", stage="s",
                             entry="e"):
            await clock.advance(0.5)  # the step takes time
    assert len(batches) == 1
    batches.close()
    assert [attributes(span)["fakefleet.steps"] for span in spans.batches()] == [4, 2]


async def test_a_malformed_context_runs_the_step_untraced() -> None:
    spans = Spans()
    batches = tracing.FaultBatches("west", clock=FakeClock(), tracer=spans.tracer)
    with batches.writing("00-" + "0" * 32 + "-" + "0" * 16 + "-01", kind="Node", name="n",
                         stage="s", entry="e"):
        assert not trace.get_current_span().get_span_context().is_valid
    batches.close()
    assert spans.batches() == []
    assert len(batches) == 0
