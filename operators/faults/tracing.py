"""A FaultPlan's trace: where each of its spans hangs, their names and what they say.

A plan is one trace, and it is always kept. The operator's first span of a plan,
``faultplan.start``, is a child of the plan's ``fakefleet.dev/traceparent`` annotation (the hub's
member link puts it there for a fleet-wide run), or a new root; its context is recorded in
``status.traceparent`` with the status write that records the start. Every later span of the
plan (``faultplan.inject``, ``faultplan.recover``, ``faultplan.expectation``,
``faultplan.finish``) is a child of that recorded context, never of whatever happens to be
current, so an operator restarted mid-plan carries on in the same trace from what the API shows.

The fault entries a step writes carry the context of its inject (or recover) span
(:attr:`operators.api.injections.FaultEntry.traceparent`): the engine's work on them joins the
plan's trace there.

No I/O and no SDK: trace contexts are read with ``opentelemetry-api`` alone; the handler makes
the spans with the tracer it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from operators.api import faultplans as api
from operators.faults.targets import Victim
from primitives import propagation

START = "faultplan.start"
INJECT = "faultplan.inject"
RECOVER = "faultplan.recover"
EXPECTATION = "faultplan.expectation"
FINISH = "faultplan.finish"

#: OpenTelemetry's own names (``trace show`` puts a span's k8s.cluster.name in its cluster
#: column); the rest are ours.
CLUSTER = "k8s.cluster.name"
NAMESPACE = "k8s.namespace.name"
PLAN = "fakefleet.plan"
PLAN_UID = "fakefleet.plan.uid"
STEPS = "fakefleet.plan.steps"
OCCURRENCES = "fakefleet.plan.occurrences"
STARTED_AT = "fakefleet.plan.started_at"
RESUMED = "fakefleet.plan.resumed"
STEP = "fakefleet.step"
OCCURRENCE = "fakefleet.occurrence"
FAULT = "fakefleet.fault.type"
TARGETS = "fakefleet.targets"
CLUSTERS = "fakefleet.clusters"
SKIPPED = "fakefleet.skipped"
CAUSE = "fakefleet.recovery.cause"
EXPECTATION_NAME = "fakefleet.expectation"
OUTCOME = "fakefleet.expectation.outcome"
LATENCY = "fakefleet.expectation.latency_seconds"
WITHIN = "fakefleet.expectation.within_seconds"
MESSAGE = "fakefleet.message"
PHASE = "fakefleet.plan.phase"
VERDICT = "fakefleet.plan.verdict"
STEPS_DONE = "fakefleet.plan.steps_done"
PASSED = "fakefleet.plan.expectations_passed"
FAILED = "fakefleet.plan.expectations_failed"

Attributes = dict[str, AttributeValue]


# -- where spans hang --------------------------------------------------------------------------

def start_parent(annotation: str) -> tuple[otel_context.Context, list[trace.Link]]:
    """Where ``faultplan.start`` hangs, given the plan's traceparent annotation: under the span
    it names; a new root linked to it when that span was not sampled (its children would be
    dropped too, and a plan's trace is always kept); a new root when there is none."""
    remote = propagation.span_context(annotation)
    if remote is None:
        return otel_context.Context(), []
    if not remote.trace_flags.sampled:
        return otel_context.Context(), [trace.Link(remote)]
    parent = propagation.parent(annotation)
    assert parent is not None, "span_context() found one"
    return parent, []


def plan_parent(traceparent: str) -> otel_context.Context:
    """The parent of every later span of a plan: the start recorded in its status. An empty
    Context (a root) when none was recorded, never the caller's current span."""
    return propagation.parent(traceparent) or otel_context.Context()


def trace_id(span: trace.Span) -> str:
    """The span's trace id as ``status.traceId`` and ``fakefleet trace`` spell it; "" when the
    span has no valid context (tracing is off)."""
    context = span.get_span_context()
    return trace.format_trace_id(context.trace_id) if context.is_valid else ""


# -- attributes --------------------------------------------------------------------------------

def plan_attributes(namespace: str, name: str, uid: str) -> Attributes:
    """What every span of a plan says about the plan."""
    return {PLAN: f"{namespace}/{name}", NAMESPACE: namespace, PLAN_UID: uid}


def start_attributes(spec: api.FaultPlanSpec, status: api.FaultPlanStatus) -> Attributes:
    return {STEPS: len(spec.steps), OCCURRENCES: len(status.injections),
            STARTED_AT: status.startedAt}


def step_attributes(step: api.Step, occurrence: int, victims: Sequence[Victim]) -> Attributes:
    """An injection's or a recovery's: the step, the fault, how many victims and where. A
    single cluster is also named as k8s.cluster.name, so ``trace show`` shows it."""
    clusters = clusters_of(victims)
    attributes: Attributes = {STEP: step.name, OCCURRENCE: occurrence,
                              FAULT: step.fault.type, TARGETS: len(victims),
                              CLUSTERS: clusters}
    if len(clusters) == 1:
        attributes[CLUSTER] = clusters[0]
    return attributes


def expectation_attributes(step: api.Step, occurrence: int, result: api.ExpectationStatus,
                           within: float, victims: Sequence[Victim]) -> Attributes:
    """An expectation judged: its outcome and the latency observed (from the injection to the
    first look where it held, or the deadline)."""
    attributes = step_attributes(step, occurrence, victims)
    attributes.update({EXPECTATION_NAME: result.name, OUTCOME: result.outcome,
                       LATENCY: result.latencySeconds or 0.0, WITHIN: within})
    if result.message:
        attributes[MESSAGE] = result.message
    return attributes


def finish_attributes(status: api.FaultPlanStatus) -> Attributes:
    results = [r for i in status.injections for r in i.expectations]
    return {PHASE: status.phase, VERDICT: status.verdict, STEPS_DONE: status.stepsDone,
            PASSED: sum(1 for r in results if r.outcome == "Passed"),
            FAILED: sum(1 for r in results if r.outcome == "Failed")}


def clusters_of(victims: Iterable[Victim]) -> list[str]:
    return sorted({victim.cluster for victim in victims})
