"""The engine's spans: one per batch of fault writes that share a trace context, never one per
object.

A fault entry written by a FaultPlan step carries that step's trace context
(:attr:`operators.api.injections.FaultEntry.traceparent`, kept on each compiled rule). When
the engine carries out such a stage, the step (every write it makes for one object) runs inside
:meth:`FaultBatches.writing`: the steps of one trace context that run together, or follow each
other within ``linger`` seconds, make one ``engine.fault_batch`` span, a child of the entry's
context. The steps' HTTP requests are made with that span current, so they carry its
``traceparent`` (:func:`operators.k8s.client.traced`) and the kube-apiserver's spans for them
are its children. A fault on 1000 nodes is one span (or a few, when its writes come in bursts
further apart than ``linger``, or last longer than ``longest``), not 1000.

Default stages carry no trace context: their steps never enter here, and the engine's
background work (heartbeats, Lease renewals, pod lifecycles) makes no spans and sends no
``traceparent``. Uses ``opentelemetry-api`` only; the entry point configures the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import time
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from primitives import propagation
from primitives.clocks import Clock

BATCH = "engine.fault_batch"
CLUSTER = "k8s.cluster.name"
OBJECTS = "fakefleet.objects"
KINDS = "fakefleet.kinds"
STAGES = "fakefleet.stages"
ENTRIES = "fakefleet.entries"
STEPS = "fakefleet.steps"
FAILED = "fakefleet.failed_steps"

#: Seconds a batch waits after its last step for another of the same trace context: the steps
#: of one fault's targets go out as connections free up, not all at once.
LINGER = 0.25
#: Seconds after which a batch takes no more steps (a crash loop's restarts, minutes apart or
#: back to back, are a span per burst, not one span for the whole fault).
LONGEST = 5.0
#: At most this many distinct values in a list attribute (entry ids, stage names).
LISTED = 32


@dataclasses.dataclass(eq=False)
class _Batch:
    span: trace.Span
    current: otel_context.Context  # the span as the current span, for the steps to attach
    opened: float  # the engine clock's time
    objects: set[str] = dataclasses.field(default_factory=set)
    kinds: set[str] = dataclasses.field(default_factory=set)
    stages: set[str] = dataclasses.field(default_factory=set)
    entries: set[str] = dataclasses.field(default_factory=set)
    steps: int = 0
    failed: int = 0
    in_flight: int = 0
    idle_since: float = 0.0  # the clock's time its last step ended
    ended_ns: int = 0  # the wall time its last step ended: the span's end
    sealed: bool = False  # takes no more steps; ends once none is in flight


#: The batch of the step running in this task (None: an untraced step).
_STEP: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar("fault_batch",
                                                                     default=None)


class FaultBatches:
    """The open ``engine.fault_batch`` spans of one engine, by trace context; :meth:`run`
    ends each once its steps are over and ``linger`` seconds passed without another."""

    def __init__(self, cluster: str, *, clock: Clock, tracer: trace.Tracer | None = None,
                 linger: float = LINGER, longest: float = LONGEST) -> None:
        self.cluster = cluster
        self._clock = clock
        self._tracer = tracer or trace.get_tracer("operators.engine")
        self._linger = linger
        self._longest = longest
        self._open: dict[str, _Batch] = {}
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._open)

    @contextlib.contextmanager
    def writing(self, traceparent: str, *, kind: str, name: str, stage: str,
                entry: str) -> Iterator[None]:
        """Run one object's step (its writes) in the batch of ``traceparent``, the batch's
        span current. A malformed context runs the step untraced."""
        batch = self._batch(traceparent)
        if batch is None:
            yield
            return
        batch.steps += 1
        batch.in_flight += 1
        batch.objects.add(f"{kind}/{name}")
        batch.kinds.add(kind)
        batch.stages.add(stage)
        batch.entries.add(entry)
        token = otel_context.attach(batch.current)
        step = _STEP.set(batch)
        try:
            yield
        finally:
            _STEP.reset(step)
            otel_context.detach(token)
            batch.in_flight -= 1
            batch.ended_ns = time.time_ns()
            batch.idle_since = self._clock.now()
            if batch.in_flight == 0:
                if batch.sealed:
                    self._end(batch)
                else:
                    self._changed.set()

    @staticmethod
    def failed(error: BaseException) -> None:
        """A write of the current step failed (it is tried again later, in a batch of its
        own): the batch counts it, and records the first error. Nothing happens outside a
        batch, so untraced steps may call it at no cost."""
        batch = _STEP.get()
        if batch is None:
            return
        batch.failed += 1
        if batch.failed == 1:  # the first error says why; the count says how many
            batch.span.record_exception(error)

    async def run(self) -> None:
        """End the batches whose steps are over and that waited ``linger`` for another; at the
        end (the engine stops), end every batch still open."""
        try:
            while True:
                self._changed.clear()
                wait = self._end_idle()
                await self._clock.wait(self._changed, wait)
        finally:
            self.close()

    def close(self) -> None:
        """End every open batch now (their spans are exported with the SDK's shutdown)."""
        for batch in self._open.values():
            self._end(batch)
        self._open.clear()

    def _batch(self, traceparent: str) -> _Batch | None:
        batch = self._open.get(traceparent)
        now = self._clock.now()
        if batch is not None and now - batch.opened < self._longest:
            return batch
        if batch is not None:
            self._seal(traceparent, batch)
        parent = propagation.parent(traceparent)
        if parent is None:
            return None
        span = self._tracer.start_span(BATCH, context=parent, kind=trace.SpanKind.INTERNAL,
                                       attributes={CLUSTER: self.cluster})
        batch = _Batch(span, trace.set_span_in_context(span, parent), opened=now)
        self._open[traceparent] = batch
        return batch

    def _seal(self, traceparent: str, batch: _Batch) -> None:
        del self._open[traceparent]
        batch.sealed = True
        if batch.in_flight == 0:
            self._end(batch)

    def _end_idle(self) -> float | None:
        """End the batches idle for ``linger``; seconds until the next may be (None: none
        open, or all busy: a step's end wakes :meth:`run`)."""
        now = self._clock.now()
        wait: float | None = None
        for traceparent, batch in list(self._open.items()):
            if batch.in_flight:
                continue
            left = batch.idle_since + self._linger - now
            if left <= 0:
                del self._open[traceparent]
                self._end(batch)
            else:
                wait = left if wait is None else min(wait, left)
        return wait

    @staticmethod
    def _end(batch: _Batch) -> None:
        attributes: dict[str, AttributeValue] = {
            OBJECTS: len(batch.objects), STEPS: batch.steps,
            KINDS: sorted(batch.kinds), STAGES: sorted(batch.stages)[:LISTED],
            ENTRIES: sorted(batch.entries)[:LISTED]}
        if batch.failed:
            attributes[FAILED] = batch.failed
            batch.span.set_status(trace.StatusCode.ERROR,
                                  f"{batch.failed} of {batch.steps} steps failed a write "
                                  f"(each is tried again)")
        batch.span.set_attributes(attributes)
        batch.span.end(end_time=batch.ended_ns or None)
