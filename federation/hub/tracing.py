"""The hub's spans about runs, workloads and their commands.

Each continues a trace already begun: a run's or workload's (begun by the RunPlan or
SubmitWorkload call), or a command's (begun by its first sending). The hub's background work
(dispatch ticks, heartbeats, resyncs) starts no trace of its own: where there is no trace to
continue, there is no span.

Span names: ``fleet.run`` and ``fleet.workload`` (a RunPlan or SubmitWorkload as the hub
carries it out), ``hub.fanout`` (a run's commands going out), ``hub.cancel_run``,
``hub.cancel_workload``, ``hub.send_command`` (one per sending of one command to one member; a
resend is a child of the first sending), ``hub.command_acknowledged`` and
``hub.command_result`` (the hub taking a member's ack or result in: children of the context
the member's message carries).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from federation.api import member_pb2
from federation.client import tracing
from federation.hub import convert
from primitives import propagation


@contextlib.contextmanager
def continuing(tracer: trace.Tracer, name: str, traceparent: str,
               attributes: Mapping[str, AttributeValue], *,
               kind: trace.SpanKind = trace.SpanKind.INTERNAL,
               links: Sequence[trace.Link] = ()) -> Iterator[trace.Span | None]:
    """A span in the trace ``traceparent`` names, current in the block; None (no span) when
    it names none."""
    context = propagation.parent(traceparent)
    if context is None:
        yield None
        return
    with tracer.start_as_current_span(name, context=context, kind=kind, attributes=attributes,
                                      links=links) as span:
        yield span


def of(span: trace.Span | None) -> str:
    """The traceparent of ``span``; "" for none."""
    return propagation.traceparent(span) if span is not None else ""


def command_id_attributes(cluster: str, command_id: str) -> dict[str, AttributeValue]:
    return {tracing.CLUSTER: cluster, tracing.COMMAND_ID: command_id}


def result_attributes(cluster: str,
                      result: member_pb2.CommandResult) -> dict[str, AttributeValue]:
    attributes = command_id_attributes(cluster, result.command_id)
    outcome = convert.OUTCOMES.get(result.phase)
    attributes[tracing.PHASE] = outcome.value if outcome is not None else ""
    if result.verdict:
        attributes[tracing.VERDICT] = result.verdict
    return attributes
