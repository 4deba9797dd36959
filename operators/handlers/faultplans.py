"""kopf glue for FaultPlan: a daemon per plan that injects, recovers and judges on schedule,
and a finalizer that recovers whatever is still injected when the plan is deleted.

Observe, then act, then record: the daemon starts from the plan's status (a restarted operator
carries on where it stopped), chooses an occurrence's victims from the fleet as it is when the
occurrence is due, records them in the status, writes the fault entries into the victims
(idempotent by id), and only then records the occurrence as Injected. Recovery flips the
entries to their recovery stages; the occurrence is Recovered once the engines marked every
entry done (everything written back) and the entries are removed.

Node and pod faults travel as stages in the objects' ``fakefleet.dev/faults`` annotation
(:mod:`operators.api.injections`); a node Delete as a hold in its pool; a cluster fault as an
entry on the FakeCluster, which :func:`operators.handlers.clusters.hold_components` (components
to stop), the cluster's engine (APIServerSlow) or its hub link (HubPartition, HubLatency) obeys.
A cluster fault's entry is removed when the fault ends, and nobody marks it done: it is
recovered once the entry is gone and what it stopped runs again.

``spec.startAt`` is the plan's time zero when given; ``spec.clusters`` narrows every step to
those FakeClusters (their names are the only ones looked at).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import kopf
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.durations import parse_duration
from operators.api.faultplans import (
    INSTANT_FAULTS,
    Expectation,
    ExpectationStatus,
    FaultPlan,
    FaultPlanStatus,
    InjectionStatus,
    Step,
)
from operators.api.injections import (
    FaultEntry,
    read_entries,
    read_held,
    render_entries,
    render_held,
)
from operators.api.status import condition
from operators.faults import catalogue, executing, tracing
from operators.faults import expectations as ex
from operators.faults.planning import PlanError
from operators.faults.progress import FINAL_PHASES
from operators.faults.targets import ClusterView, Fleet, NodeView, PodView, TargetError, Victim
from operators.handlers.clusters import hold_components, member_access
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.discovery import Known, UnknownKind, list_objects
from operators.k8s.errors import Conflict, K8sError, NotFound, TransportError
from operators.k8s.events import render_event
from operators.k8s.times import micro_time, parse, rfc3339
from operators.reconciling.clusters import cluster_key
from primitives import keys, propagation

logger = logging.getLogger(__name__)

BASE = f"/apis/{API_VERSION}/namespaces/{{namespace}}"
PLAN = BASE + "/faultplans/{name}"
CLUSTERS = BASE + "/fakeclusters"
POOLS = BASE + "/fakenodepools"
#: How often pending expectations and recoveries are looked at (s).
TICK = 1.0
#: Writes of one injection in flight at once, per member cluster.
CONCURRENCY = 64
CONFLICT_RETRIES = 8
#: How long after its moment a step waits for a member the operator cannot reach yet, before
#: it is judged without it (s).
MEMBER_WAIT = 60.0
#: Victims one injection may have, and all injections of a plan: they are recorded in the
#: status (about 40 bytes each), which must stay well under etcd's 1.5 MiB per object.
MAX_VICTIMS = 5000
MAX_RECORDED = 20000


class PlanRunner:
    """One plan's progress: its status, and clients of the members it touches."""

    def __init__(self, runtime: Runtime, plan: FaultPlan, *,
                 connect: Callable[[FakeCluster, str], Client | None] | None = None,
                 tracer: trace.Tracer | None = None) -> None:
        self.runtime = runtime
        #: A client of a member cluster (the default reaches it as the cluster handler does;
        #: tests pass in-memory API servers).
        self._connect = connect or self._connect_member
        #: Makes the plan's spans (:mod:`operators.faults.tracing`); tests pass one of an SDK
        #: provider that keeps the spans in memory.
        self.tracer = tracer or trace.get_tracer(__name__)
        self.plan = plan
        self.namespace: str = plan.metadata["namespace"]
        self.name: str = plan.metadata["name"]
        self.uid: str = plan.metadata.get("uid", "")
        self.status = plan.status or FaultPlanStatus()
        self.steps = {step.name: step for step in plan.spec.steps}
        self._clients: dict[str, Client] = {}
        self._clusters: dict[str, FakeCluster] = {}
        #: (server, apiVersion, kind) → (plural, namespaced), from the API's discovery.
        self._plurals: Known = {}
        self._written = self.status.model_dump(mode="json")
        #: Victims as the last list showed them, so that a write can go out without reading
        #: each object first; and their uids (for Events about them).
        self._seen: dict[Seen, dict[str, Any]] = {}
        self._uids: dict[Seen, str] = {}

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

    async def start(self) -> None:
        """Plan the times and record time zero: spec.startAt (every member of a fleet-wide run
        has the same one), or now; and the plan's trace, with the same write."""
        with self._start_span() as span:
            trace_id, traceparent = tracing.trace_id(span), propagation.traceparent(span)
            clusters = await self.clusters()
            fleet = Fleet(tuple(ClusterView(name, cluster.spec.labels)
                                for name, cluster in sorted(clusters.items())))
            try:
                started = executing.time_zero(self.plan.spec, micro_time())
                plan = executing.schedule(self.plan.spec, fleet)
            except (PlanError, TargetError) as error:
                # No verdict: a plan that cannot run says nothing about the system under test.
                span.set_status(Status(StatusCode.ERROR, f"the plan cannot run: {error}"))
                await self.write(FaultPlanStatus(
                    phase="Failed", startedAt=micro_time(),
                    conditions=self._conditions(stalled=f"the plan cannot run: {error}"),
                    traceId=trace_id, traceparent=traceparent))
                return
            unknown = "; ".join(f"step {step}: no FakeCluster named {', '.join(names)} in "
                                f"namespace {self.namespace}"
                                for step, names in plan.unknown_clusters.items())
            injections = [i.model_copy(update={"message": unknown})
                          if i.step in plan.unknown_clusters else i
                          for i in executing.initial_injections(plan)]
            status = self._summarised(FaultPlanStatus(
                phase="Running", startedAt=started, injections=injections, traceId=trace_id,
                traceparent=traceparent))
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

    async def advance(self) -> None:
        now = time.time()
        elapsed = now - parse(self.status.startedAt)
        injections = list(self.status.injections)
        for due in executing.due(self.plan.spec, injections, elapsed,
                                 parse(self.status.startedAt)):
            injection = self.status.injections[due.index]
            if due.action == "inject":
                await self.inject(due.index, injection)
            else:
                await self.recover(due.index, injection)
        for index, injection in enumerate(self.status.injections):
            if injection.state == "Recovering":
                await self.settle(index, injection)
        await self.judge()
        self._summarise()

    async def _sleep(self, stopped: Callable[[], bool]) -> None:
        elapsed = time.time() - parse(self.status.startedAt)
        upcoming = executing.next_time(self.status.injections, elapsed)
        pending = any(i.state == "Recovering"
                      or any(r.outcome == "Pending" for r in i.expectations)
                      # due, but waiting for steps it comes after, or for an entry to write
                      or (i.state == "Scheduled" and (i.injectAt or 0.0) <= elapsed)
                      for i in self.status.injections)
        wait = TICK if pending or upcoming is None else max(0.0, upcoming - elapsed)
        deadline = time.monotonic() + min(wait, 30.0)
        while not stopped() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    # -- status ---------------------------------------------------------------------------------

    def _summarise(self) -> None:
        self.status = self._summarised(self.status)

    def _summarised(self, status: FaultPlanStatus) -> FaultPlanStatus:
        """``status`` with the phase, verdict and steps done its injections stand for."""
        phase, verdict, steps = executing.summary(self.plan.spec, status.injections)
        if status.phase not in ("Running", "Pending"):
            return status
        return status.model_copy(update={
            "phase": phase, "verdict": verdict, "stepsDone": steps,
            "conditions": self._conditions(phase=phase)})

    def _conditions(self, *, stalled: str = "", phase: str = "Running") -> list[Any]:
        generation = int(self.plan.metadata.get("generation", 0))
        now = rfc3339()
        previous = self.status.conditions
        finished = phase in ("Succeeded", "Failed", "Aborted")
        message = stalled or ("the plan finished" if finished else "the plan is running")
        return [
            condition("Ready", finished and not stalled, reason=phase, message=message,
                      generation=generation, now=now, previous=previous),
            condition("Reconciling", not finished and not stalled, reason=phase,
                      message="" if finished else message, generation=generation, now=now,
                      previous=previous),
            condition("Stalled", bool(stalled), reason="PlanInvalid" if stalled else "",
                      message=stalled, generation=generation, now=now, previous=previous),
        ]

    async def write(self, status: FaultPlanStatus | None = None) -> None:
        """Write ``status`` (default: the runner's) if it changed: progress that must survive
        a restart. It is the runner's only once written. The write that records the plan's
        end is made in its ``faultplan.finish`` span."""
        status = (self.status if status is None else status).model_copy(update={
            "observedGeneration": int(self.plan.metadata.get("generation", 0))})
        body = status.model_dump(mode="json")
        if body != self._written:
            ending = status.phase in FINAL_PHASES and self._written.get("phase") \
                not in FINAL_PHASES
            with self._span(tracing.FINISH, tracing.finish_attributes(status), status=status) \
                    if ending else contextlib.nullcontext():
                await self.runtime.host.patch(
                    PLAN.format(namespace=self.namespace, name=self.name) + "/status",
                    {"status": body})
            self._written = body
        self.status = status

    # -- members --------------------------------------------------------------------------------

    async def clusters(self) -> dict[str, FakeCluster]:
        found = await self.runtime.host.get(CLUSTERS.format(namespace=self.namespace))
        self._clusters = {item["metadata"]["name"]: FakeCluster.model_validate(item)
                          for item in found.get("items") or []}
        return self._clusters

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

    def _connect_member(self, cluster: FakeCluster, name: str) -> Client | None:
        access = member_access(self.runtime, cluster, cluster_key(self.namespace, name))
        if access is None:
            return None
        return Client.connect(access, connections=CONCURRENCY, timeout=15)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

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
                listed = await client.get("/api/v1/nodes")
                for item in listed.get("items") or ():
                    self._remember(name, "Node", item)
                # Only the engine's nodes: an adopted cluster's real nodes take no fault.
                nodes = tuple(NodeView(n["metadata"]["name"],
                                       (n["metadata"].get("labels") or {})[keys.POOL],
                                       n["metadata"].get("labels") or {})
                              for n in listed.get("items") or ()
                              if keys.POOL in (n["metadata"].get("labels") or {}))
                views.append(ClusterView(name, cluster.spec.labels, nodes=nodes))
            else:
                path = "/api/v1/pods" if not step.target.pods or not step.target.pods.namespace \
                    else f"/api/v1/namespaces/{step.target.pods.namespace}/pods"
                listed = await client.get(path)
                for item in listed.get("items") or ():
                    self._remember(name, "Pod", item)
                # Only pods the engine runs: bound to one of its nodes, not finished.
                ours = {n["metadata"]["name"] for n in (await client.get(
                    "/api/v1/nodes", {"labelSelector": keys.POOL})).get("items") or ()}
                pods = tuple(_pod_view(p) for p in listed.get("items") or ()
                             if (p.get("spec") or {}).get("nodeName") in ours
                             and not (p["metadata"].get("deletionTimestamp")
                                      or (p.get("status") or {}).get("phase") in
                                      ("Succeeded", "Failed")))
                views.append(ClusterView(name, cluster.spec.labels, pods=pods))
        return Fleet(tuple(views))

    async def observe(self, victims: Sequence[Victim]) -> None:
        """List the victims' nodes and pods, one list per cluster and kind (not one read per
        victim: a step may hit thousands)."""
        await self.clusters()
        wanted: dict[tuple[str, str], set[str]] = {}
        for victim in victims:
            if victim.kind != "Cluster":
                wanted.setdefault((victim.cluster, victim.kind), set()).add(victim.namespace)
        for (cluster, kind), namespaces in wanted.items():
            client = self.member(cluster)
            if client is None:
                continue
            if kind == "Node":
                paths = ["/api/v1/nodes"]
            elif len(namespaces) == 1:
                paths = [f"/api/v1/namespaces/{next(iter(namespaces))}/pods"]
            else:
                paths = ["/api/v1/pods"]
            for path in paths:
                for item in (await client.get(path)).get("items") or ():
                    self._remember(cluster, kind, item)

    def _remember(self, cluster: str, kind: str, item: dict[str, Any]) -> None:
        meta = item["metadata"]
        key = (cluster, kind, meta.get("namespace", ""), meta["name"])
        self._seen[key] = item
        self._uids[key] = meta.get("uid", "")

    def _observed(self, victim: Victim) -> dict[str, Any] | None:
        return self._seen.pop(_seen(victim), None)

    # -- inject ---------------------------------------------------------------------------------

    def _id(self, injection: InjectionStatus) -> str:
        return executing.entry_id(self.namespace, self.name, self.uid, injection.step,
                                  injection.occurrence)

    async def inject(self, index: int, injection: InjectionStatus) -> None:
        step = self.steps[injection.step]
        began = time.monotonic()
        # Chosen before the span: while a member cannot be reached yet, this raises at every
        # tick, and those tries are no part of what the plan did.
        picked = None if injection.targets else await self._pick(step, injection)
        victims = list(picked) if picked is not None else \
            [executing.victim_of(text) for text in injection.targets]
        with self._span(tracing.INJECT, tracing.step_attributes(
                step, injection.occurrence, victims)) as span:
            if picked is not None:
                skipped = "" if victims else injection.message or \
                    "nothing matched the target when the step was due"
                skipped = skipped or self._too_many(len(victims))
                if skipped:
                    span.set_attribute(tracing.SKIPPED, skipped)
                    self._replace(index, state="Skipped", message=skipped)
                    return
                # Recorded before anything is written: a successor injects into exactly these.
                self._replace(index, targets=[executing.victim_text(v) for v in victims])
                await self.write()
                injection = self.status.injections[index]
            await self._inject_all(index, injection, step, victims, began,
                                   propagation.traceparent(span))

    async def _pick(self, step: Step, injection: InjectionStatus) -> Sequence[Victim]:
        """The occurrence's victims in the fleet as it is now (none: it is skipped)."""
        late = time.time() - parse(self.status.startedAt) - (injection.injectAt or 0.0)
        fleet = await self.fleet(step, patient=late < MEMBER_WAIT)
        schedule = executing.schedule(self.plan.spec, fleet)
        mine = next(i for i in schedule.injections
                    if i.step == injection.step and i.occurrence == injection.occurrence)
        return mine.victims

    async def _inject_all(self, index: int, injection: InjectionStatus, step: Step,
                          victims: Sequence[Victim], began: float, traceparent: str) -> None:
        """Write every victim's entry (carrying ``traceparent``, the injection span's), then
        record the occurrence as injected."""
        if not any(_seen(v) in self._seen for v in victims):
            await self.observe(victims)  # recorded before a restart: look at them now
        chosen = time.monotonic()
        problems, failed = await self._each(
            victims, lambda v: self._inject_one(step, injection, v, traceparent))
        logger.info("plan %s/%s: %s#%d: %d victims chosen in %.2fs, entries written in %.2fs",
                    self.namespace, self.name, step.name, injection.occurrence, len(victims),
                    chosen - began, time.monotonic() - chosen)
        if failed:
            # Not injected until every victim has its entry: the next tick writes the rest
            # (entries already written are not written twice).
            message = f"{len(failed)} of {len(victims)} entries not written yet, trying again"
            trace.get_current_span().set_status(Status(StatusCode.ERROR, message))
            self._replace(index, message=_summary(message, failed))
            return
        state = "Done" if step.fault.type in INSTANT_FAULTS else "Injected"
        now = micro_time()
        # The fault lasts its duration from when it is in place, however late that was.
        recover_at = None if step.duration is None else \
            parse(now) - parse(self.status.startedAt) + parse_duration(step.duration)
        self._replace(index, state=state, injectedAt=now, recoverAt=recover_at,
                      message=_summary("", problems) or injection.message,
                      expectations=[ExpectationStatus(name=e.name)
                                    for e in step.expectations])
        await self.write()
        self._plan_event("Normal", "FaultInjected",
                         f"step {step.name} #{injection.occurrence}: {step.fault.type} on "
                         f"{len(victims)} target(s)" + (f" ({_summary('', problems)})"
                                                        if problems else ""))
        await self._member_events(victims, "Warning", "FaultInjected",
                                  f"{step.fault.type} injected by FaultPlan "
                                  f"{self.namespace}/{self.name} (step {step.name})")

    async def _inject_one(self, step: Step, injection: InjectionStatus, victim: Victim,
                          traceparent: str) -> str:
        fault = step.fault
        entry_id = self._id(injection)
        if victim.kind == "Cluster":
            return await self._cluster_entries(victim.cluster, entry_id, add=fault,
                                               traceparent=traceparent)
        client = self.member(victim.cluster)
        if client is None:
            return f"{victim}: the cluster is not reachable"
        if victim.kind == "Pod":
            def add_pod(entries: list[FaultEntry], pod: dict[str, Any]) -> list[FaultEntry]:
                if any(e.id == entry_id for e in entries):
                    return entries
                restarts = max((c.get("restartCount", 0) for c in (pod.get("status") or {})
                                .get("containerStatuses") or ()), default=0)
                return [*entries, _traced(catalogue.pod_entry(
                    entry_id, fault, restarts=catalogue.one_shot_restarts(entries, restarts)),
                    traceparent)]
            return await edit_entries(client, _pod_path(victim), add_pod, str(victim),
                                      self._observed(victim), traceparent=traceparent)
        if fault.type == "Delete":
            return await self._hold(victim, entry_id, hold=True, traceparent=traceparent)

        def add_node(entries: list[FaultEntry], node: dict[str, Any]) -> list[FaultEntry]:
            if any(e.id == entry_id for e in entries):
                return entries
            gpus, extended = catalogue.node_gpus(node)
            return [*entries, _traced(catalogue.node_entry(entry_id, fault, gpus=gpus,
                                                           extended=extended), traceparent)]
        return await edit_entries(client, f"/api/v1/nodes/{victim.name}", add_node, str(victim),
                                  self._observed(victim), traceparent=traceparent)

    async def _hold(self, victim: Victim, entry_id: str, *, hold: bool,
                    traceparent: str = "") -> str:
        """Hold (or release) a deleted node in its pool, which the engine obeys."""
        client = self.member(victim.cluster)
        pool = ""
        if client is not None:
            with contextlib.suppress(NotFound):
                node = await client.get(f"/api/v1/nodes/{victim.name}")
                pool = (node["metadata"].get("labels") or {}).get(keys.POOL, "")
        if not pool:
            pool = await self._pool_holding(entry_id)
        if not pool:
            return f"{victim}: not a node of a FakeNodePool, so it cannot be deleted and " \
                   f"made again" if hold else ""
        path = f"{POOLS.format(namespace=self.namespace)}/{pool}"
        for _ in range(CONFLICT_RETRIES):
            try:
                current = await self.runtime.host.get(path)
            except NotFound:
                return f"{victim}: FakeNodePool {pool} is gone"
            held = read_held(current["metadata"].get("annotations"))
            names = set(held.get(entry_id, ()))
            names = names | {victim.name} if hold else names - {victim.name}
            held[entry_id] = sorted(names)
            value = render_held(held)
            if value == current["metadata"].get("annotations", {}).get(keys.HELD_NODES):
                return ""
            try:
                await self.runtime.host.patch(path, {"metadata": {
                    "resourceVersion": current["metadata"]["resourceVersion"],
                    "annotations": _with_trace({keys.HELD_NODES: value}, traceparent)}})
                return ""
            except Conflict:
                continue
        return f"{victim}: FakeNodePool {pool} kept changing; the hold was not written"

    async def _pool_holding(self, entry_id: str) -> str:
        found = await self.runtime.host.get(POOLS.format(namespace=self.namespace))
        for item in found.get("items") or ():
            if entry_id in read_held(item["metadata"].get("annotations")):
                return str(item["metadata"]["name"])
        return ""

    async def _cluster_entries(self, cluster: str, entry_id: str, *,
                               add: Any = None, traceparent: str = "") -> str:
        """Add (``add``: the fault) or remove the FakeCluster's entry, then apply it;
        ``traceparent``: the span the write is made for, in the entry and the annotation."""
        known = self._clusters.get(cluster)
        # A slowdown and the hub link's faults act on processes of ours: any cluster takes them.
        stops = add is not None and add.type in catalogue.COMPONENTS
        if known is not None and known.spec.controlPlane.backend != "local" and stops:
            return (f"{cluster}: {add.type} needs a local control plane; this cluster is "
                    f"adopted (backend external), its processes are not ours")
        path = f"{CLUSTERS.format(namespace=self.namespace)}/{cluster}"

        def edit(entries: list[FaultEntry], _: dict[str, Any]) -> list[FaultEntry]:
            if add is not None and any(e.id == entry_id for e in entries):
                return entries  # written before (a restart): as it was, trace included
            kept = [e for e in entries if e.id != entry_id]
            return [*kept, _traced(catalogue.cluster_entry(entry_id, add), traceparent)] \
                if add is not None else kept
        problem = await edit_entries(self.runtime.host, path, edit, f"FakeCluster {cluster}",
                                     traceparent=traceparent)
        if problem:
            return problem
        key = cluster_key(self.namespace, cluster)
        async with self.runtime.lock(key):  # as the cluster handler: one at a time
            try:
                fresh = FakeCluster.model_validate(await self.runtime.host.get(path))
            except NotFound:
                return ""
            await hold_components(self.runtime, fresh, key)
        return ""

    # -- recover --------------------------------------------------------------------------------

    async def recover(self, index: int, injection: InjectionStatus, *,
                      cause: str = "duration") -> None:
        """Flip the entries to their recovery stages (or release holds); Recovering until the
        engines wrote everything back (:meth:`settle`). ``cause``: why now (the fault's
        duration is over, or the plan was deleted)."""
        step = self.steps[injection.step]
        victims = [executing.victim_of(text) for text in injection.targets]
        with self._span(tracing.RECOVER, {**tracing.step_attributes(
                step, injection.occurrence, victims), tracing.CAUSE: cause}) as span:
            await self._recover_all(index, injection, step, victims,
                                    propagation.traceparent(span))

    async def _recover_all(self, index: int, injection: InjectionStatus, step: Step,
                           victims: Sequence[Victim], traceparent: str) -> None:
        entry_id = self._id(injection)
        if step.fault.type != "Delete":
            await self.observe(victims)

        async def one(victim: Victim) -> str:
            if victim.kind == "Cluster":
                return await self._cluster_entries(victim.cluster, entry_id,
                                                   traceparent=traceparent)
            if step.fault.type == "Delete":
                return await self._hold(victim, entry_id, hold=False, traceparent=traceparent)
            client = self.member(victim.cluster)
            if client is None:
                return f"{victim}: the cluster is not reachable"
            return await edit_entries(client, _path(victim), _flip(entry_id, traceparent),
                                      str(victim), self._observed(victim),
                                      traceparent=traceparent)
        problems, failed = await self._each(victims, one)
        if problems:
            logger.warning("plan %s/%s: recovery of %s: %s", self.namespace, self.name,
                           injection.step, _summary("", problems))
        if failed:
            message = f"recovery of {len(failed)} of {len(victims)} not written yet, trying again"
            trace.get_current_span().set_status(Status(StatusCode.ERROR, message))
            self._replace(index, message=_summary(message, failed))
            return
        self._replace(index, state="Recovering")
        await self.write()

    async def settle(self, index: int, injection: InjectionStatus) -> None:
        """Recovered once every victim is back: entries done (then removed), held nodes made
        again, stopped components running."""
        step = self.steps[injection.step]
        entry_id = self._id(injection)
        victims = [executing.victim_of(text) for text in injection.targets]
        if step.fault.type != "Delete":
            await self.observe(victims)  # lists the clusters too
        else:
            await self.clusters()
        gate = asyncio.Semaphore(CONCURRENCY)

        async def back(victim: Victim) -> bool:
            async with gate:
                return await self._recovered(step, entry_id, victim)
        if not all(await asyncio.gather(*(back(v) for v in victims))):
            return
        self._replace(index, state="Recovered", recoveredAt=micro_time())
        await self.write()
        self._plan_event("Normal", "FaultRecovered",
                         f"step {step.name} #{injection.occurrence}: {step.fault.type} "
                         f"recovered on {len(victims)} target(s)")
        await self._member_events(victims, "Normal", "FaultRecovered",
                                  f"{step.fault.type} recovered by FaultPlan "
                                  f"{self.namespace}/{self.name} (step {step.name})")

    async def _recovered(self, step: Step, entry_id: str, victim: Victim) -> bool:
        try:
            if victim.cluster not in self._clusters:
                return True  # the FakeCluster is gone, and all of it with it
            if victim.kind == "Cluster":
                return await self._component_back(victim.cluster, step, entry_id)
            client = self.member(victim.cluster)
            if client is None:
                return False
            if step.fault.type == "Delete":
                try:
                    node = await client.get(f"/api/v1/nodes/{victim.name}")
                except NotFound:
                    return not await self._served(victim)
                return any(c.get("type") == "Ready" and c.get("status") == "True"
                           for c in (node.get("status") or {}).get("conditions") or ())
            obj = self._observed(victim)
            if obj is None:
                return True  # not listed: gone, nothing left to undo
            entries, _ = read_entries(obj["metadata"].get("annotations"))
            mine = next((e for e in entries if e.id == entry_id), None)
            if mine is None:
                return True
            if mine.state == "inject":  # its flip was lost (a restart, an error): again
                await edit_entries(client, _path(victim), _flip(entry_id, ""), str(victim), obj)
                return False
            if mine.state != "done":
                return False

            def drop(entries: list[FaultEntry], _: dict[str, Any]) -> list[FaultEntry]:
                return [e for e in entries if e.id != entry_id]
            return not await edit_entries(client, _path(victim), drop, str(victim), obj)
        except K8sError as error:
            logger.info("plan %s/%s: %s not confirmed recovered yet: %s", self.namespace,
                        self.name, victim, error)
            return False

    async def _served(self, victim: Victim) -> bool:
        """Whether a pool of the victim's cluster still has the deleted node's name (so its
        engine makes it again)."""
        found = await self.runtime.host.get(POOLS.format(namespace=self.namespace))
        for pool in found.get("items") or ():
            prefix = f"{pool['metadata']['name']}-"
            index = victim.name[len(prefix):]
            if pool["spec"].get("clusterRef") == victim.cluster and \
                    victim.name.startswith(prefix) and index.isdigit() and \
                    int(index) < int(pool["spec"].get("replicas", 0)):
                return True
        return False

    async def _component_back(self, cluster: str, step: Step, entry_id: str) -> bool:
        known = self._clusters.get(cluster)
        if known is not None and any(
                entry.id == entry_id for entry in
                read_entries(known.metadata.get("annotations"))[0]):
            # Its removal was lost (a restart, an error): remove it again.
            await self._cluster_entries(cluster, entry_id)
            return False
        local = self.runtime.substrate.clusters.get(cluster_key(self.namespace, cluster))
        if local is None:
            return True
        component = catalogue.COMPONENTS.get(step.fault.type)
        if component is None:
            return True  # a slowdown or a hub-link fault: over once its entry is gone
        process = local.processes.get(component)
        if process is None or not process.running:
            return False
        if component != "kube-apiserver":
            return True
        client = self.member(cluster)
        if client is None:
            return False
        try:
            await client.get_text("/readyz")
        except K8sError:
            return False
        return True

    # -- expectations ---------------------------------------------------------------------------

    async def judge(self) -> None:
        now = time.time()
        for index, injection in enumerate(self.status.injections):
            if not injection.injectedAt or all(r.outcome != "Pending"
                                               for r in injection.expectations):
                continue
            step = self.steps[injection.step]
            injected = parse(injection.injectedAt)
            victims = [executing.victim_of(text) for text in injection.targets]
            results = []
            for spec, result in zip(step.expectations, injection.expectations, strict=False):
                if result.outcome != "Pending":
                    results.append(result)
                    continue
                try:
                    expectation = executing.expectation_of(spec)
                    holds = await self._holds(expectation, victims)
                except (ex.ExpectationError, ValueError) as error:
                    results.append(self._judged(step, injection, spec, result.model_copy(update={
                        "outcome": "Failed", "latencySeconds": 0.0,
                        "message": f"expectation {spec.name} cannot be judged: {error}"}),
                        victims))
                    continue
                except K8sError as error:
                    holds, message = False, f"could not look: {error}"
                    result = result.model_copy(update={"message": message})
                except Exception as error:  # a defect of an expression must not stop the plan
                    logger.exception("plan %s/%s: expectation %s", self.namespace, self.name,
                                     spec.name)
                    results.append(self._judged(step, injection, spec, result.model_copy(update={
                        "outcome": "Failed", "latencySeconds": 0.0,
                        "message": f"expectation {spec.name} cannot be judged: {error!r}"}),
                        victims))
                    continue
                deadline = ex.Deadline(expectation, injected)
                outcome = deadline.observe(now, holds)
                if outcome is None:
                    results.append(result)
                    continue
                results.append(self._judged(step, injection, spec, result.model_copy(update={
                    "outcome": outcome.outcome, "latencySeconds": round(outcome.latency, 3),
                    "message": "" if outcome.outcome == "Passed" else
                    f"did not hold within {spec.within}"}), victims))
                if outcome.outcome == "Failed":
                    self._plan_event("Warning", "ExpectationFailed",
                                     f"step {step.name} #{injection.occurrence}: expectation "
                                     f"{spec.name} did not hold within {spec.within}")
            self._replace(index, expectations=results)

    def _judged(self, step: Step, injection: InjectionStatus, spec: Expectation,
                result: ExpectationStatus, victims: Sequence[Victim]) -> ExpectationStatus:
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
        return result

    async def _holds(self, expectation: ex.Expectation, victims: Sequence[Victim]) -> bool:
        objects = expectation.objects
        if objects.cluster == "host":
            listed = await self._list(self.runtime.host, objects, objects.namespace
                                      or self.namespace)
            return expectation.holds(objects.pick("", listed, ()))
        clusters = sorted({v.cluster for v in victims})
        picked: list[Any] = []
        for cluster in clusters:
            client = self.member(cluster)
            if client is None:
                raise NotFound(404, "NotFound", f"cluster {cluster} is not reachable")
            listed = await self._list(client, objects, objects.namespace)
            picked += objects.pick(cluster, listed, victims)
        return expectation.holds(picked)

    async def _list(self, client: Client, objects: ex.Objects, namespace: str) -> list[Any]:
        try:
            return await list_objects(client, objects.api_version, objects.kind,
                                      namespace=namespace, name=objects.name,
                                      known=self._plurals)
        except UnknownKind as error:
            raise ex.ExpectationError(f"objects: {error}") from error

    # -- helpers --------------------------------------------------------------------------------

    async def _each(self, victims: Sequence[Victim],
                    act: Callable[[Victim], Any]) -> tuple[list[str], list[str]]:
        """``act`` on every victim, CONCURRENCY at once: the problems it reported (for good: a
        victim gone, one that cannot take the fault), and the API errors to try again."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def guarded(victim: Victim) -> tuple[str, str]:
            async with gate:
                try:
                    problem: str = await act(victim)
                    return problem, ""
                except K8sError as error:
                    return "", f"{victim}: {error}"
        found = await asyncio.gather(*(guarded(v) for v in victims))
        return [p for p, _ in found if p], [e for _, e in found if e]

    def _too_many(self, victims: int) -> str:
        """Why an occurrence with this many victims is not injected ("" if it may be): the
        victims are recorded in the status, which must stay well under etcd's object size."""
        recorded = sum(len(i.targets) for i in self.status.injections)
        if victims > MAX_VICTIMS:
            return (f"{victims} victims, more than {MAX_VICTIMS} in one injection: set "
                    f"target.maxTargets (or a smaller percent)")
        if recorded + victims > MAX_RECORDED:
            return (f"{victims} more victims would make {recorded + victims} in the plan, more "
                    f"than {MAX_RECORDED}: set target.maxTargets or use fewer occurrences")
        return ""

    def _replace(self, index: int, **changes: Any) -> None:
        injections = list(self.status.injections)
        injections[index] = injections[index].model_copy(update=changes)
        self.status = self.status.model_copy(update={"injections": injections})

    def _plan_event(self, kind: str, reason: str, message: str) -> None:
        body = kopf.Body(kopf.RawBody({
            "apiVersion": API_VERSION, "kind": "FaultPlan",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}}))
        with contextlib.suppress(Exception):  # an event lost must not stop the plan
            kopf.event(body, type=kind, reason=reason, message=message)

    async def _member_events(self, victims: Sequence[Victim], kind: str, reason: str,
                             message: str) -> None:
        async def one(victim: Victim) -> str:
            if victim.kind == "Cluster":
                return ""
            client = self.member(victim.cluster)
            if client is None:
                return ""
            uid = self._uids.get(_seen(victim), "")
            event = render_event(kind=victim.kind, name=victim.name, uid=uid,
                                 namespace=victim.namespace, event_type=kind, reason=reason,
                                 message=message, host="fakefleet-faultplan", now=rfc3339())
            event["source"] = {"component": "fakefleet-faultplan"}
            event["reportingComponent"] = "fakefleet-faultplan"
            with contextlib.suppress(Conflict, NotFound):
                await client.create(f"/api/v1/namespaces/{event['metadata']['namespace']}"
                                    f"/events", event, decode=False)
            return ""
        await self._each(victims, one)


#: How a listed object is found again: (cluster, kind, namespace, name).
Seen = tuple[str, str, str, str]


def _seen(victim: Victim) -> Seen:
    return (victim.cluster, victim.kind, victim.namespace, victim.name)


def _summary(head: str, problems: Sequence[str], shown: int = 5) -> str:
    """``head``, then the first few problems and how many more (status messages stay short)."""
    if not problems:
        return head
    listed = "; ".join(problems[:shown])
    more = f" (and {len(problems) - shown} more)" if len(problems) > shown else ""
    return f"{head}: {listed}{more}" if head else f"{listed}{more}"


def _pod_view(pod: dict[str, Any]) -> PodView:
    meta = pod["metadata"]
    owner = next((ref for ref in meta.get("ownerReferences") or () if ref.get("controller")),
                 None)
    return PodView(meta.get("namespace", ""), meta["name"], meta.get("labels") or {},
                   owner.get("kind", "") if owner else "", owner.get("name", "") if owner else "",
                   tuple(c["name"] for c in (pod.get("spec") or {}).get("containers") or ()))


def _pod_path(victim: Victim) -> str:
    return f"/api/v1/namespaces/{victim.namespace}/pods/{victim.name}"


def _path(victim: Victim) -> str:
    return _pod_path(victim) if victim.kind == "Pod" else f"/api/v1/nodes/{victim.name}"


def _traced(entry: FaultEntry, traceparent: str) -> FaultEntry:
    """The entry carrying the trace context of the span that writes it (none: untraced)."""
    return entry.model_copy(update={"traceparent": traceparent or None})


def _with_trace(annotations: dict[str, str | None], traceparent: str) -> dict[str, str | None]:
    """The annotations to patch, with the object's traceparent when the write is traced."""
    return {**annotations, keys.TRACEPARENT: traceparent} if traceparent else annotations


def _flip(entry_id: str, traceparent: str) -> Callable[[list[FaultEntry], Any],
                                                        list[FaultEntry]]:
    """An edit that turns entry ``entry_id`` to its recovery stages, traced by
    ``traceparent`` (none: it keeps the one it has)."""
    def flip(entries: list[FaultEntry], _: Any) -> list[FaultEntry]:
        return [e.model_copy(update={"state": "recover",
                                     "traceparent": traceparent or e.traceparent})
                if e.id == entry_id and e.state == "inject" else e for e in entries]
    return flip


async def edit_entries(client: Client, path: str,
                       edit: Callable[[list[FaultEntry], dict[str, Any]], list[FaultEntry]],
                       what: str, observed: dict[str, Any] | None = None, *,
                       traceparent: str = "") -> str:
    """Read the object's fault entries, ``edit`` them, write them back on the resourceVersion
    read (retrying on conflicts); "" when written or nothing changed, else what went wrong.
    ``observed``: the object as a list just showed it, tried first without reading it again
    (a write on a stale resourceVersion fails with a conflict, and then it is read).
    ``traceparent``: the span the write is made in, also set as the object's
    fakefleet.dev/traceparent annotation by the same write."""
    for _ in range(CONFLICT_RETRIES):
        obj = observed
        observed = None
        try:
            if obj is None:
                obj = await client.get(path)
        except NotFound:
            return f"{what}: not found"
        annotations = obj["metadata"].get("annotations") or {}
        entries, problem = read_entries(annotations)
        if problem:
            entries = []
        changed = edit(entries, obj)
        value = render_entries(changed)
        if value == annotations.get(keys.FAULTS):
            return ""
        try:
            await client.patch(path, {"metadata": {
                "resourceVersion": obj["metadata"]["resourceVersion"],
                "annotations": _with_trace({keys.FAULTS: value}, traceparent)}}, decode=False)
            return ""
        except Conflict:
            continue
        except NotFound:
            return f"{what}: not found"
    return f"{what}: changed by others {CONFLICT_RETRIES} times in a row; not written"


# -- kopf handlers ------------------------------------------------------------------------------

async def run(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped,
              **_: Any) -> None:
    """Daemon: one per plan, for as long as it runs (kopf starts it again on resume)."""
    runtime: Runtime = memo.runtime
    key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
    runtime.plans.add(key)
    try:
        plan = FaultPlan.model_validate(await runtime.host.get(PLAN.format(
            namespace=body["metadata"]["namespace"], name=body["metadata"]["name"])))
        if plan.metadata.get("deletionTimestamp"):
            return
        runner = PlanRunner(runtime, plan, tracer=runtime.tracer)
        await runner.run(lambda: bool(stopped))
    except K8sError as error:
        raise kopf.TemporaryError(f"plan {key}: {error}", delay=2) from error
    finally:
        runtime.plans.discard(key)


async def delete(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer: recover everything the plan injected; the plan goes once all is undone."""
    runtime: Runtime = memo.runtime
    key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
    if key in runtime.plans:
        # kopf stops the daemon when the plan is deleted, but runs this meanwhile: an
        # injection it is writing now must be seen here, so wait until it has stopped.
        raise kopf.TemporaryError("waiting for the plan's daemon to stop", delay=1)
    try:
        plan = FaultPlan.model_validate(await runtime.host.get(PLAN.format(
            namespace=body["metadata"]["namespace"], name=body["metadata"]["name"])))
    except NotFound:
        return
    runner = PlanRunner(runtime, plan, tracer=runtime.tracer)
    try:
        await runner.clusters()
        for index, injection in enumerate(runner.status.injections):
            if not injection.targets or injection.state in ("Recovered", "Skipped"):
                continue
            if injection.state in ("Injected", "Done", "Scheduled"):
                await runner.recover(index, injection, cause="plan deleted")
            await runner.settle(index, runner.status.injections[index])
        left = [i for i in runner.status.injections
                if i.targets and i.state not in ("Recovered", "Skipped")]
        if runner.status.phase in ("Running", "Pending"):
            runner.status = runner.status.model_copy(update={"phase": "Aborted"})
        with contextlib.suppress(NotFound):
            await runner.write()
        if left:
            raise kopf.TemporaryError(
                f"waiting for {len(left)} injection(s) to be recovered: "
                + ", ".join(f"{i.step}#{i.occurrence}" for i in left[:5]), delay=1)
    except K8sError as error:
        raise kopf.TemporaryError(f"recovery: {error}", delay=2) from error
    finally:
        await runner.close()
