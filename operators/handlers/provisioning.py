"""The ``fakecluster.provision`` span of a FakeCluster reconcile, made only when the reconcile
changes something (and ``fakecluster.teardown``, of its deletion).

A reconcile runs on every change, on resume and on a timer; most runs find nothing to do and
must leave no span (a trace per timer tick would bury the ones that matter). Whether a run
changes something is known only once it has looked, so the span is opened then, with its start
set back to when the reconcile began: it covers the look that led to the change, and every
write made from then on happens with it current (and carries its traceparent).

The reconcile is asynchronous to whatever asked for the cluster, so the span is a root that
*links* to the FakeCluster's ``fakefleet.dev/traceparent`` annotation, never its child.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from types import TracebackType

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from primitives import propagation

PROVISION = "fakecluster.provision"
TEARDOWN = "fakecluster.teardown"
CLUSTER = "k8s.cluster.name"
NAMESPACE = "k8s.namespace.name"
ACTIONS = "fakefleet.actions"
BACKEND = "fakefleet.backend"


class Provisioning:
    """A span opened by the first :meth:`open` (none at all when nothing calls it), closed
    when the ``with`` block ends; a failure that leaves the block is recorded on it."""

    def __init__(self, tracer: trace.Tracer, namespace: str, name: str,
                 annotations: Mapping[str, str] | None, *, backend: str = "",
                 name_of_span: str = PROVISION) -> None:
        self._tracer = tracer
        self._name = name_of_span
        self._began = time.time_ns()
        self._links = propagation.links(propagation.from_annotations(annotations))
        self._attributes: dict[str, AttributeValue] = {
            CLUSTER: name, NAMESPACE: namespace, BACKEND: backend}
        self._stack = contextlib.ExitStack()
        self._actions: list[str] = []
        self.span: trace.Span | None = None

    def __enter__(self) -> Provisioning:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stack.__exit__(kind, error, traceback)

    def open(self, actions: list[str] | None = None) -> None:
        """The reconcile is about to change ``actions`` (names of what it does)."""
        if self.span is None:
            self.span = self._stack.enter_context(self._tracer.start_as_current_span(
                self._name, context=otel_context.Context(), links=self._links,
                attributes=self._attributes, start_time=self._began))
        if actions:
            self._actions += actions
            self.span.set_attribute(ACTIONS, self._actions)

    def fail(self, message: str) -> None:
        """The change did not succeed (a failure the reconcile reports rather than raises)."""
        if self.span is not None:
            self.span.set_status(Status(StatusCode.ERROR, message))

