"""A FaultPlan's trace, made by the real SDK into memory over in-memory API servers: one trace
whose start is recorded in the status, every later span a child of it, also after a restart;
fault entries and their objects carrying the span that wrote them; a plan annotated by whoever
created it hanging under that span; the end traced once. And the FakeCluster reconcile's span:
made only when the reconcile changes something, linked to the cluster's annotation."""

from __future__ import annotations

import json
import time
from typing import Any

import kopf
import pytest
from click.testing import CliRunner
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from federation.telemetry.setup import configure
from operators.api.faultplans import FaultPlan
from operators.cli import main, planreading, planwatching
from operators.faults import tracing
from operators.handlers.faultplans import PlanRunner, delete
from operators.handlers.provisioning import PROVISION, Provisioning
from operators.k8s.times import micro_time
from primitives import keys, propagation
from tests.test_faultplan_runner import CORDON, PLANS, SETS, World

#: Passes at the first look: the plan's verdict is reached without an engine.
SEEN = {"name": "seen", "within": "30s", "count": {"atLeast": 1},
        "objects": {"kind": "Node", "victims": True}}
REMOTE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Spans:
    """A TracerProvider of the SDK whose finished spans are kept in memory, as a test's
    process of its own (``configure(..., set_global=False)``: the global one stays unset)."""

    def __init__(self, service: str = "fakefleet-operator") -> None:
        self.provider = configure(service, set_global=False)
        self.exporter = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("test")

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]

    def names(self) -> list[str]:
        return [span.name for span in self.exporter.get_finished_spans()]


async def runner_of(world: World, spans: Spans) -> PlanRunner:
    """A runner as the daemon makes one: from the plan as the API shows it now."""
    plan = FaultPlan.model_validate(await world.host.get(f"{PLANS}/p"))
    return PlanRunner(world.runtime, plan, connect=lambda _, name: world.members[name],
                      tracer=spans.tracer)


async def started(world: World, spans: Spans, seconds_ago: float) -> PlanRunner:
    runner = await runner_of(world, spans)
    await runner.start()
    await runner.write(runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - seconds_ago)}))
    return runner


def context_of(span: ReadableSpan) -> str:
    """The traceparent of a finished span."""
    return propagation.traceparent(trace.NonRecordingSpan(span.get_span_context()))


async def recorded_status(world: World) -> dict[str, Any]:
    status: dict[str, Any] = (await world.host.get(f"{PLANS}/p"))["status"]
    return status


async def run_to_the_end(world: World, runner: PlanRunner) -> None:
    """Inject, let the duration pass, recover, as the engine would mark the fault set done."""
    await runner.advance()
    await runner.write()
    await runner.write(runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 20)}))
    await runner.advance()
    await runner.write()
    await world.engine_marks_done()
    await runner.advance()
    await runner.write()


async def test_a_plan_is_one_trace_under_the_start_its_status_records() -> None:
    world, spans = World(), Spans()
    world.plan({**CORDON, "expectations": [SEEN]})
    runner = await started(world, spans, 1)
    # The in-memory API server serves no discovery: what it would say of nodes.
    runner._plurals[(world.member.server, "v1", "Node")] = ("nodes", False)
    (start,) = spans.named(tracing.START)
    status = await recorded_status(world)
    assert status["traceparent"] == context_of(start)
    assert status["traceId"] == trace.format_trace_id(start.context.trace_id)
    assert start.parent is None, "no annotation: the plan's trace begins here"
    assert start.attributes is not None
    assert start.attributes[tracing.PLAN] == "default/p"

    await run_to_the_end(world, runner)
    assert runner.status.phase == "Succeeded"
    later = [span for span in spans.exporter.get_finished_spans() if span is not start]
    assert sorted({span.name for span in later}) == sorted(
        {tracing.INJECT, tracing.EXPECTATION, tracing.RECOVER, tracing.FINISH})
    for span in later:
        assert span.context.trace_id == start.context.trace_id, span.name
        assert span.parent is not None, span.name
        assert span.parent.span_id == start.context.span_id, \
            f"{span.name} is a child of the recorded start"

    (inject,) = spans.named(tracing.INJECT)
    assert inject.attributes is not None
    assert inject.attributes[tracing.STEP] == "cordon"
    assert inject.attributes[tracing.FAULT] == "Cordon"
    assert inject.attributes[tracing.TARGETS] == 2
    assert inject.attributes[tracing.CLUSTERS] == ("west",)
    assert inject.attributes[tracing.CLUSTER] == "west"
    (expectation,) = spans.named(tracing.EXPECTATION)
    assert expectation.attributes is not None
    assert expectation.attributes[tracing.OUTCOME] == "Passed"
    judged = runner.status.injections[0].expectations[0]
    assert expectation.attributes[tracing.LATENCY] == judged.latencySeconds
    assert expectation.attributes[tracing.WITHIN] == 30.0
    (finish,) = spans.named(tracing.FINISH)
    assert finish.attributes is not None
    assert finish.attributes[tracing.VERDICT] == "Passed"
    assert finish.attributes[tracing.PHASE] == "Succeeded"


async def test_a_restarted_operator_carries_on_in_the_same_trace() -> None:
    world, before = World(), Spans()
    world.plan(CORDON)
    await started(world, before, 1)
    (start,) = before.named(tracing.START)
    # The operator dies; its successor (another process) knows only what the API shows.
    after = Spans()
    successor = await runner_of(world, after)
    await successor.run(lambda: successor.status.injections[0].state == "Injected")
    assert tracing.START not in after.names(), "the plan's trace is not begun again"
    (inject,) = after.named(tracing.INJECT)
    assert inject.context.trace_id == start.context.trace_id
    assert inject.parent is not None
    assert inject.parent.span_id == start.context.span_id
    assert (await recorded_status(world))["traceparent"] == context_of(start)


async def test_a_fault_set_carries_the_span_that_wrote_it_and_then_the_recovery_s() -> None:
    world, spans = World(), Spans()
    world.plan(CORDON)
    runner = await started(world, spans, 1)
    await runner.advance()
    await runner.write()
    (inject,) = spans.named(tracing.INJECT)
    (found,) = world.sets()
    assert found.traceparent == context_of(inject)
    assert {group.entry.traceparent for group in found.groups} == {context_of(inject)}
    (create,) = world.member_api.sent("POST", SETS)
    assert dict(create.headers)["traceparent"][:-2] == context_of(inject)[:-2], \
        "the create is made in the span: the API server's span of it is its child"

    await runner.write(runner.status.model_copy(
        update={"startedAt": micro_time(time.time() - 20)}))
    await runner.advance()
    (recover,) = spans.named(tracing.RECOVER)
    (found,) = world.sets()
    assert (found.state, found.traceparent) == ("recover", context_of(recover))


async def test_a_cluster_fault_entry_carries_the_injection_span() -> None:
    world, spans = World(), Spans()
    world.plan({"name": "slow", "target": {}, "fault": {"type": "APIServerSlow",
                                                        "latency": "500ms"}, "at": "0s"})
    runner = await started(world, spans, 1)
    await runner.advance()
    (inject,) = spans.named(tracing.INJECT)
    cluster = await world.host.get("/apis/fakefleet.dev/v1alpha1/namespaces/default/"
                                   "fakeclusters/west")
    annotations = cluster["metadata"]["annotations"]
    assert annotations[keys.TRACEPARENT] == context_of(inject)
    assert '"traceparent":"' + context_of(inject) + '"' in annotations["fakefleet.dev/faults"]


async def test_a_plan_annotated_by_its_creator_is_traced_under_that_span() -> None:
    world, spans = World(), Spans()
    world.plan(CORDON)
    await world.host.patch(f"{PLANS}/p", {"metadata": {"annotations": {
        keys.TRACEPARENT: REMOTE}}})
    await started(world, spans, 1)
    (start,) = spans.named(tracing.START)
    assert trace.format_trace_id(start.context.trace_id) == REMOTE.split("-")[1]
    assert start.parent is not None
    assert trace.format_span_id(start.parent.span_id) == REMOTE.split("-")[2]
    assert (await recorded_status(world))["traceId"] == REMOTE.split("-")[1]


async def test_an_unsampled_creator_gets_a_link_and_the_plan_a_kept_trace_of_its_own() -> None:
    world, spans = World(), Spans()
    world.plan(CORDON)
    unsampled = REMOTE[:-2] + "00"
    await world.host.patch(f"{PLANS}/p", {"metadata": {"annotations": {
        keys.TRACEPARENT: unsampled}}})
    await started(world, spans, 1)
    (start,) = spans.named(tracing.START)
    assert start.parent is None
    assert [trace.format_span_id(link.context.span_id) for link in start.links] == \
        [REMOTE.split("-")[2]]
    assert start.context.trace_flags.sampled


async def test_the_end_is_traced_once_also_when_the_plan_is_deleted(monkeypatch: Any) -> None:
    world, spans = World(), Spans()
    world.plan({**CORDON, "duration": "1h"})
    runner = await started(world, spans, 1)
    await runner.advance()
    await runner.write()
    world.runtime.tracer = spans.tracer  # type: ignore[misc]
    # The finalizer reaches the members as the daemon does (here: the in-memory ones).
    monkeypatch.setattr(PlanRunner, "_connect_member",
                        lambda _, __, name: world.members[name])
    body = kopf.Body(kopf.RawBody(await world.host.get(f"{PLANS}/p")))
    memo = kopf.Memo(runtime=world.runtime)
    with pytest.raises(kopf.TemporaryError, match="to be recovered"):
        await delete(body=body, memo=memo)  # kopf calls it again until all is recovered
    await world.engine_marks_done()
    await delete(body=body, memo=memo)
    (recover,) = spans.named(tracing.RECOVER)
    assert recover.attributes is not None
    assert recover.attributes[tracing.CAUSE] == "plan deleted"
    (finish,) = spans.named(tracing.FINISH)
    assert finish.attributes is not None
    assert finish.attributes[tracing.PHASE] == "Aborted"
    # A successor for the ended plan adds nothing to its trace.
    successor = await runner_of(world, spans)
    await successor.run(lambda: True)
    assert len(spans.named(tracing.FINISH)) == 1


async def test_no_tracing_configured_records_no_trace_and_changes_nothing() -> None:
    world = World()
    world.plan(CORDON)
    plan = FaultPlan.model_validate(await world.host.get(f"{PLANS}/p"))
    runner = PlanRunner(world.runtime, plan, connect=lambda _, name: world.members[name],
                        tracer=trace.NoOpTracer())
    await runner.start()
    await runner.advance()
    status = await recorded_status(world)
    assert (status["traceId"], status["traceparent"]) == ("", "")
    (found,) = world.sets()
    assert found.traceparent == ""
    assert {group.entry.traceparent for group in found.groups} == {None}


# -- FakeCluster reconciles --------------------------------------------------------------------

def test_a_reconcile_that_changes_nothing_leaves_no_span() -> None:
    spans = Spans()
    with Provisioning(spans.tracer, "default", "west", {}):
        pass
    assert spans.names() == []


def test_a_reconcile_that_provisions_is_a_span_linked_to_the_clusters_annotation() -> None:
    spans = Spans()
    began = time.time_ns()
    with Provisioning(spans.tracer, "default", "west", {keys.TRACEPARENT: REMOTE},
                      backend="local") as provisioning:
        provisioning.open(["StartControlPlane"])
        assert trace.get_current_span() is provisioning.span, "its writes carry it"
        provisioning.open(["StartEngine"])
        provisioning.fail("the apiserver did not start")
    (span,) = spans.named(PROVISION)
    assert span.parent is None, "asynchronous: linked, not parented"
    assert [trace.format_span_id(link.context.span_id) for link in span.links] == \
        [REMOTE.split("-")[2]]
    assert span.attributes is not None
    assert span.attributes["k8s.cluster.name"] == "west"
    assert span.attributes["fakefleet.actions"] == ("StartControlPlane", "StartEngine")
    assert span.start_time is not None
    assert span.start_time >= began, "it covers the look that led to the change"
    assert span.status.status_code == trace.StatusCode.ERROR


# -- the CLI -----------------------------------------------------------------------------------

def test_plan_watch_ends_with_the_trace_id_and_the_command_that_shows_it(
        monkeypatch: Any, tmp_path: Any) -> None:
    trace_id = REMOTE.split("-")[1]
    status = {"phase": "Succeeded", "verdict": "Passed", "stepsDone": "1/1", "traceId": trace_id}

    async def watched(*_: Any, **__: Any) -> dict[tuple[str, str], dict[str, Any]]:
        return {("default", "p"): status}

    monkeypatch.setattr(planwatching, "watch_plans", watched)
    monkeypatch.setattr(planreading.PlanTarget, "client", lambda self: _NoClient())
    result = CliRunner().invoke(main, ["plan", "watch", "p", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    assert last == f"trace {trace_id}: fakefleet trace show {trace_id} --state-dir {tmp_path}"

    result = CliRunner().invoke(main, ["plan", "watch", "p", "--state-dir", str(tmp_path),
                                           "-o", "json"])
    assert result.exit_code == 0, result.output
    (concluded,) = json.loads(result.stdout)
    assert concluded["traceId"] == trace_id
    assert concluded["traceCommand"] == f"fakefleet trace show {trace_id} --state-dir {tmp_path}"
    assert concluded["verdict"] == "Passed"


class _NoClient:
    async def __aenter__(self) -> _NoClient:
        return self

    async def __aexit__(self, *_: Any) -> None:
        return None
