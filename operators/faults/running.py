"""One FaultPlan's run: observe, decide, act, record, then sleep until the next round.

The runner starts from the plan's status (a restarted operator carries on where it stopped)
and, every round, asks :func:`operators.faults.deciding.decide` what is due and carries it out:
it chooses an occurrence's victims from the fleet as it is when the occurrence is due, records
them in the status (or, when the status could not hold their list, in a ConfigMap of the plan
that the status names, written first), has the fault written
(:mod:`operators.faults.delivering`: a fault set per member, idempotent by id), and only then
records the occurrence as Injected. Recovery turns the sets to their recovery stages; the
occurrence is Recovered once every victim is back. Expectations are judged on the objects the
member (or host) API lists (:mod:`operators.k8s.discovery`). The status is written when it
changed (progress that must survive a restart), its messages cut so that it stays bounded in
bytes, each action in a span of the plan's trace (:mod:`operators.faults.tracing`).

``spec.startAt`` is the plan's time zero when given; ``spec.clusters`` narrows every step to
those FakeClusters (their names are the only ones looked at).

What it needs of the operator around it is passed in: the host client, how to reach a member
(``connect``), how to apply a FakeCluster's entries and whether a component runs (for
:class:`~operators.faults.delivering.Delivery`), how to send an Event about the plan
(``announce``), the CEL workers that judge ``cel`` expectations
(:mod:`operators.faults.evaluating`), the tracer and the clock. It decides nothing itself (that is
:mod:`~operators.faults.deciding`'s) and knows nothing of kopf.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.durations import parse_duration
from operators.api.faultplans import (
    Expectation,
    ExpectationStatus,
    FaultPlan,
    FaultPlanStatus,
    InjectionStatus,
    Step,
)
from operators.faults import deciding, executing, tracing
from operators.faults import expectations as ex
from operators.faults.deciding import Outcome
from operators.faults.delivering import CLUSTERS, Apply, Delivery, Running
from operators.faults.evaluating import CelUnavailable, CelWorkers
from operators.faults.planning import PlanError
from operators.faults.progress import FINAL_PHASES
from operators.faults.targets import ClusterView, Fleet, NodeView, PodView, TargetError, Victim
from operators.k8s import owning
from operators.k8s.client import Client
from operators.k8s.discovery import Known, UnknownKind, list_objects
from operators.k8s.errors import K8sError, NotFound, TransportError, brief
from operators.k8s.times import micro_time, parse
from primitives import keys, propagation
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

PLAN = f"/apis/{API_VERSION}/namespaces/{{namespace}}/faultplans/{{name}}"
CONFIGMAPS = "/api/v1/namespaces/{namespace}/configmaps"
#: Where a ConfigMap that lists victims apart holds them.
TARGETS_KEY = "targets.gz"
#: How often a sleeping plan looks whether it was stopped (s).
STOP_POLL = 0.2

#: Reaches a member cluster: a client of its API server, None while it cannot be reached yet.
Connect = Callable[[FakeCluster, str], Client | None]
#: Sends an Event about the plan: type, reason, message.
Announce = Callable[[str, str, str], None]


class Runner:
    """One plan's progress: its status, and clients of the members it touches."""

    def __init__(self, plan: FaultPlan, *, host: Client, connect: Connect, apply: Apply,
                 running: Running, announce: Announce, cel: CelWorkers,
                 tracer: trace.Tracer, clock: Clock) -> None:
        self.plan = plan
        self.host = host
        self.cel = cel
        self._connect = connect
        self._announce = announce
        #: Makes the plan's spans; tests pass one of an SDK provider that keeps them in memory.
        self.tracer = tracer
        self.clock = clock
        self.namespace: str = plan.metadata["namespace"]
        self.name: str = plan.metadata["name"]
        self.uid: str = plan.metadata.get("uid", "")
        self.status = plan.status or FaultPlanStatus()
        self.steps = {step.name: step for step in plan.spec.steps}
        self._clients: dict[str, Client] = {}
        self._clusters: dict[str, FakeCluster] = {}
        self._plurals: Known = {}
        #: Victims listed apart, by ConfigMap, once read or written.
        self._listed: dict[str, list[Victim]] = {}
        self._written = self.status.model_dump(mode="json")
        self.delivery = Delivery(plan=f"{self.namespace}/{self.name}", namespace=self.namespace,
                                 host=host, members=self, apply=apply, running=running)

    # -- the loop -------------------------------------------------------------------------------

    async def run(self, stopped: Callable[[], bool]) -> None:
        try:
            if not self.status.startedAt:
                await self.start()
            elif self.status.phase == "Running" and not self.status.traceparent:
                await self.resume_trace()
            while not stopped() and self.status.phase == "Running":
                await self.advance()
                await self.write()
                await self._sleep(stopped)
        finally:
            await self.close()

    async def advance(self) -> None:
        """One round: what :func:`~operators.faults.deciding.decide` says is due now."""
        for action in deciding.decide(self.plan.spec, self.status, self.clock.now()):
            await self.execute(action)
        self.status = deciding.summarised(self.plan, self.status, self.status.conditions,
                                          self.clock.now())

    async def execute(self, action: deciding.Action) -> None:
        """Carry out ``action`` on the occurrences as the status says now."""
        injections = self.status.injections
        if isinstance(action, deciding.Inject):
            await self.inject(action.index, injections[action.index])
        elif isinstance(action, deciding.Recover):
            await self.recover(action.index, injections[action.index], cause=action.cause)
        elif isinstance(action, deciding.Settle):
            if injections[action.index].state == "Recovering" or not action.recovering_only:
                await self.settle(action.index, injections[action.index])
        else:
            await self.judge(action.indices)

    async def abort(self) -> list[InjectionStatus]:
        """The finalizer's round: recover everything the plan injected, record the plan as
        Aborted; what is not recovered yet."""
        await self.clusters()
        for action in deciding.undo(self.status):
            await self.execute(action)
        left = deciding.unrecovered(self.status)
        self.status = deciding.aborted(self.status)
        with contextlib.suppress(NotFound):
            await self.write()
        return left

    async def _sleep(self, stopped: Callable[[], bool]) -> None:
        deadline = self.clock.now() + deciding.wait(self.status, self.clock.now())
        while not stopped() and self.clock.now() < deadline:
            await self.clock.sleep(min(STOP_POLL, max(0.0, deadline - self.clock.now())))

    # -- start and trace ------------------------------------------------------------------------

    async def start(self) -> None:
        """Plan the times and record time zero: spec.startAt (every member of a fleet-wide run
        has the same one), or now; and the plan's trace, with the same write."""
        with self._start_span() as span:
            trace_id, traceparent = tracing.trace_id(span), propagation.traceparent(span)
            clusters = await self.clusters()
            fleet = Fleet(tuple(ClusterView(name, cluster.spec.labels)
                                for name, cluster in sorted(clusters.items())))
            try:
                started = executing.time_zero(self.plan.spec, micro_time(self.clock.now()))
                schedule = executing.schedule(self.plan.spec, fleet)
            except (PlanError, TargetError) as error:
                span.set_status(Status(StatusCode.ERROR, f"the plan cannot run: {error}"))
                await self.write(deciding.refused(
                    self.plan, str(error), trace_id=trace_id, traceparent=traceparent,
                    previous=self.status.conditions, now=self.clock.now()))
                return
            status = deciding.begun(self.plan, schedule, started, trace_id=trace_id,
                                    traceparent=traceparent, previous=self.status.conditions,
                                    now=self.clock.now())
            span.set_attributes(tracing.start_attributes(self.plan.spec, status))
            await self.write(status)

    async def resume_trace(self) -> None:
        """Give a running plan that has no trace recorded (an operator without tracing started
        it) one from now on: every later span goes there."""
        with self._start_span() as span:
            span.set_attribute(tracing.RESUMED, True)
            await self.write(self.status.model_copy(update={
                "traceId": tracing.trace_id(span), "traceparent": propagation.traceparent(span)}))

    @contextlib.contextmanager
    def _start_span(self) -> Iterator[trace.Span]:
        """``faultplan.start``: under the plan's traceparent annotation, if it has one."""
        parent, links = tracing.start_parent(propagation.from_annotations(
            self.plan.metadata.get("annotations")))
        with self.tracer.start_as_current_span(
                tracing.START, context=parent, links=links,
                attributes=tracing.plan_attributes(self.namespace, self.name, self.uid)) as span:
            yield span

    @contextlib.contextmanager
    def _span(self, name: str, attributes: tracing.Attributes, *,
              status: FaultPlanStatus | None = None) -> Iterator[trace.Span]:
        """A later span of the plan, current while it lasts (the Kubernetes writes made in it
        carry its traceparent): a child of the start that ``status`` (default: the runner's)
        recorded."""
        recorded = (self.status if status is None else status).traceparent
        with self.tracer.start_as_current_span(
                name, context=tracing.plan_parent(recorded),
                attributes={**tracing.plan_attributes(self.namespace, self.name, self.uid),
                            **attributes}) as span:
            yield span

    # -- status ---------------------------------------------------------------------------------

    async def write(self, status: FaultPlanStatus | None = None) -> None:
        """Write ``status`` (default: the runner's) if it changed: progress that must survive
        a restart. It is the runner's only once written. The write that records the plan's
        end is made in its ``faultplan.finish`` span."""
        status = deciding.bounded(self.status if status is None else status).model_copy(
            update={"observedGeneration": int(self.plan.metadata.get("generation", 0))})
        body = status.model_dump(mode="json")
        if body != self._written:
            ending = status.phase in FINAL_PHASES and self._written.get("phase") \
                not in FINAL_PHASES
            with self._span(tracing.FINISH, tracing.finish_attributes(status), status=status) \
                    if ending else contextlib.nullcontext():
                await self.host.patch(
                    PLAN.format(namespace=self.namespace, name=self.name) + "/status",
                    {"status": body})
            self._written = body
        self.status = status

    async def _record(self, outcome: Outcome, injection: InjectionStatus) -> bool:
        """Take ``outcome``'s status; unless it is unfinished (its span says why), write it and
        send its Events (about ``injection``'s victims). Whether it was finished."""
        self.status = outcome.status
        if outcome.unfinished:
            trace.get_current_span().set_status(Status(StatusCode.ERROR, outcome.unfinished))
            return False
        await self.write()
        for event in outcome.events:
            if isinstance(event, deciding.PlanEvent):
                self._plan_event(event)
            else:
                await self.delivery.events(self.steps[injection.step].fault,
                                           self._id(injection), event.victims, event.type,
                                           event.reason, event.message, self.clock.now())
        return True

    def _plan_event(self, event: deciding.PlanEvent) -> None:
        with contextlib.suppress(Exception):  # an event lost must not stop the plan
            self._announce(event.type, event.reason, event.message)

    # -- members --------------------------------------------------------------------------------

    async def clusters(self) -> dict[str, FakeCluster]:
        found = await self.host.get(CLUSTERS.format(namespace=self.namespace))
        self._clusters = {item["metadata"]["name"]: FakeCluster.model_validate(item)
                          for item in found.get("items") or []}
        return self._clusters

    def cluster(self, name: str) -> FakeCluster | None:
        return self._clusters.get(name)

    def member(self, cluster: str) -> Client | None:
        client = self._clients.get(cluster)
        if client is not None:
            return client
        known = self._clusters.get(cluster)
        if known is None:
            return None
        client = self._connect(known, cluster)
        if client is not None:
            self._clients[cluster] = client
        return client

    async def close(self) -> None:
        """Close every member client, each also when closing another failed or this is
        cancelled (a daemon cancelled while it stops)."""
        clients, self._clients = list(self._clients.values()), {}
        async with contextlib.AsyncExitStack() as closing:
            for client in clients:
                closing.push_async_callback(client.close)

    async def fleet(self, step: Step, *, patient: bool = False) -> Fleet:
        """The clusters the step may hit, with the nodes or pods its target looks at. A member
        the operator cannot reach yet (its control plane still being adopted after an operator
        restart) is waited for while ``patient``: a step is not skipped for want of a look."""
        clusters = await self.clusters()
        target = executing.target_of(step.target)
        within = self.plan.spec.clusters
        views = []
        for name, cluster in sorted(clusters.items()):
            if within and name not in within:
                continue  # another copy's cluster (spec.clusters): not even looked at
            view = ClusterView(name, cluster.spec.labels)
            if not target.clusters.holds(view) or target.kind == "Cluster":
                views.append(view)
                continue
            client = self.member(name)
            if client is None:
                if patient:
                    raise TransportError(f"member cluster {name} cannot be reached yet; step "
                                         f"{step.name} waits for it")
                views.append(view)
                continue
            if target.kind == "Node":
                views.append(ClusterView(name, cluster.spec.labels,
                                         nodes=await self._nodes(name, client)))
            else:
                views.append(ClusterView(name, cluster.spec.labels,
                                         pods=await self._pods(name, client, step)))
        return Fleet(tuple(views))

    async def _nodes(self, cluster: str, client: Client) -> tuple[NodeView, ...]:
        listed = (await client.get("/api/v1/nodes")).get("items") or ()
        for item in listed:
            self.delivery.remember(cluster, "Node", item)
        # Only the engine's nodes: an adopted cluster's real nodes take no fault.
        return tuple(NodeView(n["metadata"]["name"], (n["metadata"].get("labels") or {})[keys.POOL],
                              n["metadata"].get("labels") or {})
                     for n in listed if keys.POOL in (n["metadata"].get("labels") or {}))

    async def _pods(self, cluster: str, client: Client, step: Step) -> tuple[PodView, ...]:
        pods = step.target.pods
        path = "/api/v1/pods" if not pods or not pods.namespace else \
            f"/api/v1/namespaces/{pods.namespace}/pods"
        listed = (await client.get(path)).get("items") or ()
        for item in listed:
            self.delivery.remember(cluster, "Pod", item)
        # Only pods the engine runs: bound to one of its nodes, not finished.
        ours = {n["metadata"]["name"] for n in (await client.get(
            "/api/v1/nodes", {"labelSelector": keys.POOL})).get("items") or ()}
        return tuple(_pod_view(p) for p in listed
                     if (p.get("spec") or {}).get("nodeName") in ours
                     and not (p["metadata"].get("deletionTimestamp")
                              or (p.get("status") or {}).get("phase") in
                              ("Succeeded", "Failed")))

    # -- inject, recover, settle ----------------------------------------------------------------

    def _id(self, injection: InjectionStatus) -> str:
        return executing.entry_id(self.namespace, self.name, self.uid, injection.step,
                                  injection.occurrence)

    async def inject(self, index: int, injection: InjectionStatus) -> None:
        step = self.steps[injection.step]
        began = self.clock.now()
        # Chosen before the span: while a member cannot be reached yet, this raises at every
        # tick, and those tries are no part of what the plan did.
        picked = None if executing.recorded(injection) else await self._pick(step, injection)
        victims = list(picked) if picked is not None else await self.victims(injection)
        with self._span(tracing.INJECT, tracing.step_attributes(
                step, injection.occurrence, victims)) as span:
            if picked is not None:
                skipped = deciding.skip_reason(self.status, injection, victims)
                if skipped:
                    span.set_attribute(tracing.SKIPPED, skipped)
                    self.status = deciding.replaced(self.status, index, state="Skipped",
                                                    message=skipped)
                    return
                listed_in = await self._list_apart(injection, victims) \
                    if deciding.apart(self.status, victims) else ""
                await self.write(deciding.chosen(self.status, index, victims,
                                                 listed_in=listed_in))
            await self.delivery.look(victims)
            chosen = self.clock.now()
            delivered = await self.delivery.inject(step.fault, self._id(injection), victims,
                                                   propagation.traceparent(span))
            logger.info("plan %s/%s: %s#%d: %d victims chosen in %.2fs, their faults written "
                        "in %.2fs", self.namespace, self.name, step.name, injection.occurrence,
                        len(victims), chosen - began, self.clock.now() - chosen)
            await self._record(deciding.injected(
                self.plan, self.status, index, victims, problems=delivered.problems,
                failed=delivered.failed, now=self.clock.now()), injection)

    async def victims(self, injection: InjectionStatus) -> list[Victim]:
        """The occurrence's recorded victims: from the status, or from the ConfigMap that
        lists them apart (read once)."""
        if not injection.targetsRef:
            return [executing.victim_of(text) for text in injection.targets]
        listed = self._listed.get(injection.targetsRef)
        if listed is None:
            try:
                found = await self.host.get(
                    f"{CONFIGMAPS.format(namespace=self.namespace)}/{injection.targetsRef}")
            except NotFound:
                logger.warning("plan %s/%s: the ConfigMap %s that listed the victims of %s#%d "
                               "is gone: they cannot be reached", self.namespace, self.name,
                               injection.targetsRef, injection.step, injection.occurrence)
                return []
            packed = base64.b64decode((found.get("binaryData") or {}).get(TARGETS_KEY, ""))
            listed = [executing.victim_of(text) for text in executing.unpack_targets(packed)]
            self._listed[injection.targetsRef] = listed
        return listed

    async def _list_apart(self, injection: InjectionStatus, victims: Sequence[Victim]) -> str:
        """Write the ConfigMap that lists the occurrence's victims (before the status names
        it); its name. Owned by the plan: the garbage collector removes it with the plan."""
        name = executing.targets_name(self.uid, injection.step, injection.occurrence)
        owners = [{"apiVersion": API_VERSION, "kind": "FaultPlan", "name": self.name,
                   "uid": self.uid}] if self.uid else []
        await owning.apply(self.host, {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace, "ownerReferences": owners},
            "data": {"step": injection.step, "occurrence": str(injection.occurrence),
                     "count": str(len(victims))},
            "binaryData": {TARGETS_KEY: base64.b64encode(executing.pack_targets(
                deciding.texts(victims))).decode()},
        }, "configmaps", owner=owning.Owner(f"FaultPlan/{self.name}"))
        self._listed[name] = list(victims)
        return name

    async def _pick(self, step: Step, injection: InjectionStatus) -> Sequence[Victim]:
        """The occurrence's victims in the fleet as it is now (none: it is skipped)."""
        fleet = await self.fleet(step, patient=deciding.patient(self.status, injection,
                                                                self.clock.now()))
        return deciding.victims_in(executing.schedule(self.plan.spec, fleet), injection)

    async def recover(self, index: int, injection: InjectionStatus, *,
                      cause: str = "duration") -> None:
        """Turn the fault sets to their recovery stages (or release holds, remove cluster
        entries); Recovering until the engines wrote everything back (:meth:`settle`).
        ``cause``: why now (the fault's duration is over, or the plan was deleted)."""
        step = self.steps[injection.step]
        victims = await self.victims(injection)
        with self._span(tracing.RECOVER, {**tracing.step_attributes(
                step, injection.occurrence, victims), tracing.CAUSE: cause}) as span:
            delivered = await self.delivery.recover(step.fault, self._id(injection), victims,
                                                    propagation.traceparent(span))
            if delivered.problems:
                logger.warning("plan %s/%s: recovery of %s: %s", self.namespace, self.name,
                               injection.step, deciding.listed("", delivered.problems))
            await self._record(deciding.recovering(self.status, index, victims,
                                                   failed=delivered.failed), injection)

    async def settle(self, index: int, injection: InjectionStatus) -> None:
        """Recovered once every victim is back: fault sets done (then deleted), held nodes
        made again, stopped components running."""
        step = self.steps[injection.step]
        victims = await self.victims(injection)
        if await self.delivery.recovered(step.fault, self._id(injection), victims):
            await self._record(deciding.recovered(self.plan, self.status, index, victims,
                                                  self.clock.now()), injection)

    # -- expectations ---------------------------------------------------------------------------

    async def judge(self, indices: Sequence[int]) -> None:
        """Look at the pending expectations of these occurrences, all at one moment."""
        now = self.clock.now()
        for index in indices:
            injection = self.status.injections[index]
            if not deciding.judging(injection):
                continue
            step = self.steps[injection.step]
            victims = await self.victims(injection)
            results = []
            for spec, result in zip(step.expectations, injection.expectations, strict=False):
                if result.outcome != "Pending":
                    results.append(result)
                    continue
                expectation, look = await self._look(spec, victims)
                result, events = deciding.judged(self.plan, injection, spec, result,
                                                 expectation, look, now)
                if result.outcome != "Pending":
                    self._judged(step, injection, spec, result, victims)
                for event in events:
                    if isinstance(event, deciding.PlanEvent):
                        self._plan_event(event)
                results.append(result)
            self.status = deciding.replaced(self.status, index, expectations=results)

    async def _look(self, spec: Expectation, victims: Sequence[Victim]) -> tuple[
            ex.Expectation | None, deciding.Look]:
        """``spec`` as it is judged, and whether it holds now."""
        expectation = None
        try:
            expectation = executing.expectation_of(spec)
            return expectation, deciding.Look(holds=await self._holds(expectation, victims))
        except (ex.ExpectationError, ValueError) as error:
            return expectation, deciding.Look(invalid=brief(error))
        except (K8sError, CelUnavailable) as error:
            return expectation, deciding.Look(unseen=brief(error))
        except Exception as error:  # a defect of an expression must not stop the plan
            logger.exception("plan %s/%s: expectation %s", self.namespace, self.name,
                             spec.name)
            return expectation, deciding.Look(invalid=f"{error!r}")

    def _judged(self, step: Step, injection: InjectionStatus, spec: Expectation,
                result: ExpectationStatus, victims: Sequence[Victim]) -> None:
        """``result``, now that it is decided, as a ``faultplan.expectation`` span: from the
        injection to now, so that its length in the trace is the reaction observed."""
        injected = parse(injection.injectedAt)
        span = self.tracer.start_span(
            tracing.EXPECTATION, context=tracing.plan_parent(self.status.traceparent),
            start_time=int(injected * 1e9),
            attributes={**tracing.plan_attributes(self.namespace, self.name, self.uid),
                        **tracing.expectation_attributes(
                            step, injection.occurrence, result,
                            parse_duration(spec.within), victims)})
        if result.outcome == "Failed":
            span.set_status(Status(StatusCode.ERROR, result.message))
        span.end()

    async def _holds(self, expectation: ex.Expectation, victims: Sequence[Victim]) -> bool:
        objects = expectation.objects
        picked: list[Any] = []
        if objects.cluster == "host":
            listed = await self._list(self.host, objects, objects.namespace or self.namespace)
            picked = objects.pick("", listed, ())
        else:
            for cluster in sorted({v.cluster for v in victims}):
                client = self.member(cluster)
                if client is None:
                    raise NotFound(404, "NotFound", f"cluster {cluster} is not reachable")
                picked += objects.pick(cluster, await self._list(client, objects,
                                                                 objects.namespace), victims)
        matcher = expectation.per_object
        if isinstance(matcher, ex.Cel):  # in a worker process: cel-python has no budget
            return expectation.decide(await self.cel.matches(matcher.expression, picked))
        return expectation.decide(ex.each(matcher, picked) if matcher is not None
                                  else [True] * len(picked))

    async def _list(self, client: Client, objects: ex.Objects, namespace: str) -> list[Any]:
        try:
            return await list_objects(client, objects.api_version, objects.kind,
                                      namespace=namespace, name=objects.name,
                                      known=self._plurals)
        except UnknownKind as error:
            raise ex.ExpectationError(f"objects: {error}") from error


def _pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod["metadata"]
    owner = next((ref for ref in meta.get("ownerReferences") or () if ref.get("controller")),
                 None)
    return PodView(meta.get("namespace", ""), meta["name"], meta.get("labels") or {},
                   owner.get("kind", "") if owner else "", owner.get("name", "") if owner else "",
                   tuple(c["name"] for c in (pod.get("spec") or {}).get("containers") or ()))
