"""Trace context in the hub link and the hub's state, without a network: the FaultPlan or Job a
command makes carries the context of its execution, results are reported in the context their
object carries (after an operator restart too), the hub keeps each run's and command's context
across restarts, and the helpers that carry context behave as their docstrings say."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from federation.api import member_pb2
from federation.client.tracing import STREAMS, command_attributes, within
from federation.hub import store
from federation.hub.membership import Identity, Inventory, Member, State
from federation.hub.runs import MemberPart, Run
from federation.hub.workloads import JobRecord, JobState
from federation.telemetry import setup
from operators.api.clusters import FakeCluster
from operators.hublink import convert, jobs
from operators.hublink.member import HostMember
from operators.k8s.client import Client
from primitives import keys, propagation
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport
from tests.federation.test_hublink import (
    CLUSTERS,
    NAMESPACE,
    PLANS,
    fake_cluster,
    start,
    stop,
)
from tests.federation.test_hublink_jobs import JOBS, create
from tests.federation.test_workloads import _workload

CONTEXT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def tracer(monkeypatch: pytest.MonkeyPatch) -> Iterator[trace.Tracer]:
    """A tracer of a provider of its own (the global one stays unset), exporting nowhere."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    provider: TracerProvider = setup.configure("fakefleet-operator", "west", set_global=False)
    yield provider.get_tracer("test")
    provider.shutdown()


# -- objects made for commands -----------------------------------------------------------------

def test_a_fault_plan_and_a_job_carry_the_context_of_their_commands_execution() -> None:
    cluster = FakeCluster.model_validate(fake_cluster())
    plan = convert.fault_plan(start(), cluster, CONTEXT)
    assert plan["metadata"]["annotations"] == {keys.FLEET_COMMAND: "r1/west/start",
                                               keys.TRACEPARENT: CONTEXT}
    job = jobs.job_object(create(), CONTEXT)
    assert job["metadata"]["annotations"] == {jobs.COMMAND_ANNOTATION: "w1/west/job-0-1",
                                              keys.TRACEPARENT: CONTEXT}
    # Untraced: no annotation at all (not an empty one).
    assert keys.TRACEPARENT not in convert.fault_plan(start(), cluster)["metadata"][
        "annotations"]


class Host:
    """West's member over an in-memory host and member API; each report is kept with the
    trace context current when it was made (what the link would put on the message)."""

    def __init__(self, api: MemoryTransport | None = None,
                 cluster_api: MemoryTransport | None = None) -> None:
        self.clock = FakeClock()
        self.api = api or MemoryTransport(self.clock)
        self.cluster_api = cluster_api or MemoryTransport(self.clock)
        if api is None:
            self.api.put(CLUSTERS, fake_cluster("west"))
        cluster_client = Client(self.cluster_api, clock=self.clock)
        self.member = HostMember(Client(self.api, clock=self.clock), NAMESPACE, "west",
                                 host_id="host-a", annotations=dict,
                                 member_client=lambda: cluster_client, clock=self.clock)
        self.reports: list[tuple[str, str]] = []
        self.member.report = lambda result: self.reports.append(
            (result.command_id, propagation.traceparent()))


async def test_a_start_annotates_its_plan_and_reports_in_that_context(
        tracer: trace.Tracer) -> None:
    host = Host()
    with tracer.start_as_current_span("member.execute_command") as span:
        assert await host.member.execute(start()) is False
        executing = propagation.traceparent(span)
    [made] = host.api.objects(PLANS)
    assert propagation.from_annotations(made["metadata"]["annotations"]) == executing
    assert host.reports == [("r1/west/start", executing)]
    # Later results come from the observe loop, outside any span: still in the plan's context.
    made["status"] = {"phase": "Succeeded", "verdict": "Passed", "stepsDone": "1/1"}
    host.api.put(PLANS, made)
    await host.member.plans.report_changes()
    assert host.reports[-1] == ("r1/west/start", executing)
    assert trace.get_current_span() is trace.INVALID_SPAN, "the context does not leak"
    # A restarted operator (a new member, nothing in memory) reads the context back.
    successor = Host(api=host.api)
    await successor.member.plans.report_changes()
    assert successor.reports == [("r1/west/start", executing)]


async def test_a_stop_and_a_refusal_are_reported_in_the_context_of_their_execution(
        tracer: trace.Tracer) -> None:
    host = Host()
    with tracer.start_as_current_span("member.execute_command") as span:
        await host.member.execute(start(plan="[1]"))  # not a plan: refused
        refusing = propagation.traceparent(span)
    with tracer.start_as_current_span("member.execute_command") as span:
        await host.member.execute(stop())
        stopping = propagation.traceparent(span)
    assert host.reports == [("r1/west/start", refusing), ("r1/west/stop", stopping)]


async def test_a_create_job_annotates_its_job_and_reports_in_that_context(
        tracer: trace.Tracer) -> None:
    host = Host()
    with tracer.start_as_current_span("member.execute_command") as span:
        assert await host.member.execute(create()) is False
        executing = propagation.traceparent(span)
    [made] = host.cluster_api.objects(JOBS)
    assert propagation.from_annotations(made["metadata"]["annotations"]) == executing
    assert host.reports == [("w1/west/job-0-1", executing)]
    made["status"] = {"startTime": "2027-01-15T08:00:01Z"}
    host.member.jobs.on_job_event("MODIFIED", made)
    assert host.reports[-1] == ("w1/west/job-0-1", executing)


# -- helpers -----------------------------------------------------------------------------------

def test_within_makes_a_received_context_current_and_an_empty_one_clears_it(
        tracer: trace.Tracer) -> None:
    with tracer.start_as_current_span("unrelated"):
        with within(CONTEXT):
            assert propagation.traceparent() == CONTEXT
        with within(""):
            assert propagation.traceparent() == ""
        assert propagation.traceparent() != ""


def test_span_attributes_of_commands_name_the_cluster_the_command_and_what_it_belongs_to(
        ) -> None:
    assert command_attributes("west", start()) == {
        "k8s.cluster.name": "west", "fakefleet.command.id": "r1/west/start",
        "fakefleet.command.kind": "StartPlan", "fakefleet.run.id": "r1"}
    assert command_attributes("west", create()) == {
        "k8s.cluster.name": "west", "fakefleet.command.id": "w1/west/job-0-1",
        "fakefleet.command.kind": "CreateJob", "fakefleet.workload.id": "w1"}
    assert command_attributes("west", member_pb2.Command(id="x"))[
        "fakefleet.command.kind"] == ""


def test_the_untraced_streams_are_the_session_and_the_watches() -> None:
    assert {name.rsplit("/", 1)[1] for name in STREAMS} == {
        "Session", "WatchClusters", "WatchRun", "WatchWorkload"}


# -- the hub's state ---------------------------------------------------------------------------

def _run() -> Run:
    return Run(id="r1", name="n", plan="{}", selector={}, created_at=1.0, start_at=2.0,
               parts={"west": MemberPart(cluster="west"), "east": MemberPart(cluster="east")},
               traceparent=CONTEXT)


def test_a_run_keeps_the_context_of_each_commands_first_sending() -> None:
    run = _run()
    first = CONTEXT.replace("b7ad", "0001")
    assert run.traceparent_of("r1/west/start") == ""
    assert run.traced("r1/west/start", first)
    assert not run.traced("r1/west/start", CONTEXT), "a resend keeps the first"
    assert not run.traced("r1/west/stop", "")
    assert run.traced("r1/west/stop", CONTEXT)
    assert (run.traceparent_of("r1/west/start"), run.traceparent_of("r1/west/stop"),
            run.traceparent_of("r1/east/start")) == (first, CONTEXT, "")
    assert not run.traced("r1/north/start", CONTEXT)
    assert run.traceparent_of("nonsense") == ""


def test_a_jobs_context_is_its_current_attempts() -> None:
    workload = _workload(jobs=1)
    job = workload.jobs[0]
    workload.place(job, "west")
    assert workload.traced(job, CONTEXT)
    assert not workload.traced(job, "00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    assert workload.traceparent_of("w1/west/job-0-1") == CONTEXT
    assert workload.traceparent_of("w1/east/job-0-1") == ""
    workload.reported("w1/west/job-0-1", _failed(), 10.0)  # attempt 2 is a new command
    assert job.attempt == 2
    assert job.state is JobState.WAITING
    assert job.traceparent == ""


def _failed() -> Any:
    from federation.hub.outcomes import Outcome
    from federation.hub.workloads import Progress
    return Progress(Outcome.FAILED, message="boom")


def test_the_store_keeps_the_context_of_runs_workloads_and_commands() -> None:
    run = _run()
    run.traced("r1/west/start", CONTEXT)
    workload = _workload(jobs=1)
    workload.traceparent = CONTEXT
    workload.jobs[0] = JobRecord(index=0, arrive_at=1.0, run_seconds=1.0, traceparent=CONTEXT)
    member = Member(identity=Identity(name="west"), state=State.READY, reason="", message="",
                    registered_at=0.0, state_since=0.0, inventory=Inventory())
    snapshot = store.Snapshot(hub_id="h", members=[member], runs=[run], workloads=[workload])
    again = store.decode(store.encode(snapshot))
    assert again.runs == [run]
    assert again.workloads[0].traceparent == CONTEXT
    assert again.workloads[0].jobs[0].traceparent == CONTEXT
    # A state file written before traces were kept reads as untraced.
    old = store.encode(snapshot)
    del old["runs"][0]["traceparent"]
    for part in old["runs"][0]["parts"]:
        del part["traceparent"], part["stop_traceparent"]
    del old["workloads"][0]["traceparent"]
    del old["workloads"][0]["jobs"][0]["traceparent"]
    read = store.decode(old)
    assert read.runs[0].traceparent == ""
    assert read.runs[0].traceparent_of("r1/west/start") == ""
    assert read.workloads[0].traceparent == read.workloads[0].jobs[0].traceparent == ""
