"""The pod half of the fake kubelet: pods bound to the engine's nodes live through the pod
stages (:mod:`operators.engine.stages`).

One watch for all bound pods (``spec.nodeName!=``) instead of one per node: a field selector per
node would mean thousands of watches, and the API server offers no "nodeName in set" selector;
filtering by our node names costs one dict lookup per event. A pod bound to a node the engine
is about to play but does not play yet (its create or take-over answered late: the node was
Ready in the API before) is kept by node and run when the node is played; the watch shows it
only once. Every pod is a small :class:`~operators.engine.pods.PodFacts` and an immutable
:class:`~operators.engine.pods.PodLife`; every timer sits in one heap; a bounded number of
requests run at once (a throttling API server slows us down instead of piling requests up).

Each stage is one merge patch of the status subresource. The new life is computed, written,
and committed only when the write succeeded: a retried step is computed again from the life
the API shows, never applied twice. A pod adopted after a restart resumes from its status: a
Job pod that started 40 s before the restart with a run time of 60 s exits 20 s after it.
The pod status is the engine's as a kubelet's is its own: what another writer changes there is
written back within one sync, from what the watch shows (:mod:`~operators.engine.owning`).

A pod's stages are those of the fault entries its fault sets carry for it
(:mod:`~operators.engine.faultsets`), then the defaults
(:class:`~operators.engine.stages.Rulebook`); a set that comes, turns or goes plans it again.
A fault stage with ``endFault`` makes the entry done for the pod once its status write
succeeded (a failure retries the whole step, whose status write is the same again); the set is
marked done when all its targets are. An engine stopping before that leaves the entry live; a
one-shot fault's stages therefore select what its write changes (the restart count it was
written for, or a phase it leaves), so a restarted engine does not apply it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from operators.engine import owning, stages
from operators.engine import pods as podlife
from operators.engine.addresses import PodAddresses
from operators.engine.dispatching import Dispatcher
from operators.engine.faultsets import FaultSets
from operators.engine.lives import Lives
from operators.engine.pods import PodFacts, PodLife, life_from_status, render_status
from operators.engine.preparing import Preparations
from operators.engine.queues import DelayQueue
from operators.engine.recording import EventRecorder
from operators.engine.stages import PodRule, Rulebook, Timing
from operators.engine.tracing import FaultBatches
from operators.engine.usage import UsageBook
from operators.k8s import requests
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, Invalid, K8sError, NotFound
from operators.k8s.times import rfc3339
from operators.k8s.watching import list_and_watch
from primitives import keys
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

PODS = "/api/v1/pods"
BOUND = {"fieldSelector": "spec.nodeName!="}
#: A failed status write is tried again after 1 s doubling, at most 10 s (the kubelet's status
#: manager syncs every 10 s).
RETRY_BASE, RETRY_MAX = 1.0, 10.0


class NodeDirectory(Protocol):
    """What the pod half needs to know of the engine's nodes."""

    def node_slot(self, node: str) -> int | None: ...

    def node_coming(self, node: str) -> bool:
        """Whether the engine is about to play ``node``, which it does not play yet (its
        create or take-over is under way or due)."""

    def node_ready(self, node: str) -> bool:
        """Whether it heartbeats and the API shows it Ready (:mod:`~operators.engine.owning`)."""

    def node_ip(self, node: str) -> str: ...

    def pod_timing(self, node: str) -> tuple[Timing, int]: ...


class _Pod:
    """A pod the engine runs: its facts, its committed life, its pending stage, and how the
    status the watch shows compares with its own (:class:`~operators.engine.owning.Ownership`)."""

    __slots__ = ("due", "facts", "failures", "life", "own", "stage")

    def __init__(self, facts: PodFacts, life: PodLife, *, reported: bool) -> None:
        self.facts = facts
        self.life = life
        self.stage: PodRule | None = None  # the stage its timer is for
        self.due = 0.0  # when that stage fires
        self.failures = 0
        self.own = owning.Ownership(reported=reported)


class PodLifecycle:
    """Runs the lifecycle of every pod bound to one cluster's fake nodes."""

    def __init__(
        self,
        cluster: str,
        client: Client,
        nodes: NodeDirectory,
        recorder: EventRecorder,
        *,
        clock: Clock,
        rules: Rulebook,
        faults: FaultSets,
        concurrency: int = 64,
        batch: int = 512,
        throttle: Callable[[], bool] | None = None,
        traces: FaultBatches,
        usage: UsageBook | None = None,
        on_life: Callable[[str], None] | None = None,
    ) -> None:
        """``usage``: told of every pod's annotations and life, for the usage metrics (None:
        the engine serves none); ``on_life``: told the uid of each pod whose life changed or
        that is gone (the logs being followed)."""
        self.cluster = cluster
        self.client = client
        self._traces = traces
        self._nodes = nodes
        self._recorder = recorder
        self._clock = clock
        self._rules = rules
        self._faults = faults
        self._pods: dict[str, _Pod] = {}
        self._names: dict[tuple[str, str], str] = {}  # (namespace, name) → uid
        self._listed = False
        self._timers: DelayQueue[str] = DelayQueue(clock)
        self._refresh: set[str] = set()  # pods whose Ready must be re-reported (gates flipped)
        self._preparations = Preparations(cluster, client, recorder, clock=clock)
        self._lives = Lives(cluster, client, recorder, clock=clock)
        #: By node: pods whose status another writer changed while the node was not Ready.
        self._waiting: dict[str, set[str]] = {}
        #: By node the engine is about to play: the pods bound to it (uid → the pod as last
        #: watched), offered again when it is played (:meth:`node_played`). A node is Ready as
        #: soon as its write is stored, so a pod bound to it can be watched before the answer
        #: that plays it; the pod watch shows it only once. Dropped with the pod or the node.
        self.unplayed: dict[str, dict[str, Any]] = {}
        self._unplayed_on: dict[str, str] = {}  # uid → its node in unplayed
        self._dispatcher = Dispatcher(self._timers, self._due, clock=clock, limit=concurrency,
                                      batch=batch, name=f"engine {cluster}: pods",
                                      throttle=throttle)
        self.addresses = PodAddresses()
        self._usage = usage
        self._on_life = on_life or (lambda uid: None)

    def __len__(self) -> int:
        return len(self._pods)

    def busy(self) -> bool:
        """Whether pods wait for a free connection: more is due than the API server takes."""
        return self._dispatcher.busy()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(list_and_watch(self.client, PODS, BOUND, on_list=self._relisted,
                                             on_event=self._changed, clock=self._clock))
            group.create_task(self._dispatcher.run())

    def life(self, uid: str) -> PodLife | None:
        pod = self._pods.get(uid)
        return pod.life if pod is not None else None

    def named(self, namespace: str, name: str) -> tuple[PodFacts, PodLife] | None:
        """The pod of that name the engine runs, and its committed life (the status the API
        has from the engine)."""
        pod = self._pods.get(self._names.get((namespace, name), ""))
        return (pod.facts, pod.life) if pod is not None else None

    def runs(self, uid: str) -> bool | None:
        """Whether the engine runs pod ``uid`` (None: its pods are not listed yet)."""
        return uid in self._pods if self._listed else None

    def faults_changed(self, uid: str) -> None:
        """The pod's fault entries changed (a set came, turned or went): plan it again."""
        pod = self._pods.get(uid)
        if pod is not None:
            self._plan(pod)

    # -- events in ------------------------------------------------------------------------------

    def _relisted(self, items: list[Any]) -> None:
        self.unplayed.clear()  # kept again from the items, as they are now
        self._unplayed_on.clear()
        present = {item["metadata"]["uid"] for item in items}
        for uid in [uid for uid in self._pods if uid not in present]:
            self._forget(uid)
        for item in items:
            self._changed("ADDED", item)
        self._listed = True

    def _changed(self, kind: str, obj: Any) -> None:
        uid = obj["metadata"]["uid"]
        if kind == "DELETED":
            self._unkeep(uid)
            self._forget(uid)
            return
        known = self._pods.get(uid)
        if known is not None:
            ready_before = known.facts.gates_ready()
            claims_before = known.facts.claim_status
            logs_before = known.facts.annotations.get(keys.LOGS)
            changed = known.facts.observe(obj)
            if known.facts.annotations.get(keys.LOGS) != logs_before:
                self._warn(known.facts, known.facts.read_logs())
            if self._usage is not None:
                self._warn(known.facts, self._usage.annotated(uid, self._clock.now()))
            if changed:
                known.own.expected = None  # its readiness gates may say otherwise now
            self._watched(known, obj.get("status") or {})
            if changed:
                if known.facts.claim_status != claims_before:
                    self._preparations.claims_changed(uid)
                self._plan(known)
                if known.life.phase == podlife.RUNNING and \
                        known.facts.gates_ready() != ready_before:
                    self._refresh.add(uid)  # a readiness gate flipped: re-report Ready
                    self._timers.schedule(uid, 0.0)
                    self._dispatcher.wake()
            return
        node = obj["spec"].get("nodeName")
        self._unkeep(uid)
        if node is None or self._nodes.node_slot(node) is None:
            if node is not None and self._nodes.node_coming(node):
                self.unplayed.setdefault(node, {})[uid] = obj
                self._unplayed_on[uid] = node
            return  # not on one of our nodes (yet)
        facts = PodFacts(obj)
        facts.host_ip = self._nodes.node_ip(node)
        life = life_from_status(facts, obj.get("status") or {})
        if facts.claims_prepared is None and life.phase != podlife.PENDING:
            facts.claims_prepared = True  # it started: its claims were prepared then
        if life.ip is not None:
            self.addresses.claim(life.ip)
        status = obj.get("status") or {}
        pod = _Pod(facts, life, reported=bool(status.get("containerStatuses")))
        self._pods[uid] = pod
        self._names[(facts.namespace, facts.name)] = uid
        problems = facts.problems
        if self._usage is not None:
            problems += self._usage.seen(facts, life, self._clock.now())
        if life.phase == podlife.PENDING and not life.start_time:
            self._warn(facts, problems)  # new to us: warn once
        self._watched(pod, status)  # adopted as another writer left it (NotReady...)
        self._plan(pod)

    # -- the status the engine owns (owning) -------------------------------------------------

    def _watched(self, pod: _Pod, status: Mapping[str, Any]) -> None:
        """Before :meth:`_plan` of the same event: a write back due changes the pod's timer."""
        self._keep(pod, pod.own.watched(status, lambda: self._expected(pod),
                                        **self._judging(pod)))

    def _judging(self, pod: _Pod) -> dict[str, Any]:
        return {"node_ready": self._nodes.node_ready(pod.facts.node),
                "deleting": pod.facts.deleting, "now": self._clock.now()}

    def _expected(self, pod: _Pod) -> owning.Owned:
        if pod.own.expected is None:
            pod.own.expected = owning.owned(render_status(pod.facts, pod.life, ""))
        return pod.own.expected

    def _keep(self, pod: _Pod, action: owning.Action) -> None:
        """Do what the pod's ownership asks: a write back at its time, one once the node is
        Ready, or another writer's end taken as the pod's (a terminal phase never goes back)."""
        facts = pod.facts
        if isinstance(action, owning.Heal):
            logger.debug("engine %s: pod %s/%s: another writer changed its status; the "
                         "engine's goes back at %.0f", self.cluster, facts.namespace,
                         facts.name, action.at)
            due = self._timers.due_at(facts.uid)
            if due is None or due > action.at:
                self._timers.schedule_at(facts.uid, action.at)
                self._dispatcher.wake()
        elif isinstance(action, owning.Wait):
            self._waiting.setdefault(facts.node, set()).add(facts.uid)
        elif isinstance(action, owning.Adopt):
            pod.life = life_from_status(facts, action.status)
            pod.own.adopted()
            if action.rewrite:
                self._refresh.add(facts.uid)  # the engine's write went over the end
            else:
                self._refresh.discard(facts.uid)
            if self._usage is not None:
                self._usage.lived(facts.uid, pod.life, self._clock.now())
            self._on_life(facts.uid)
            logger.info("engine %s: pod %s/%s is %s as another writer said; the engine keeps "
                        "it so", self.cluster, facts.namespace, facts.name, pod.life.phase)
            self._plan(pod)

    def node_played(self, node: str) -> None:
        """The engine plays ``node`` from now on: the pods bound to it before are run, as the
        watch last showed them."""
        for uid, obj in self.unplayed.pop(node, {}).items():
            del self._unplayed_on[uid]
            self._changed("ADDED", obj)

    def node_gone(self, node: str) -> None:
        """``node``, not played, is gone (or will not be played): its pods are not kept."""
        for uid in self.unplayed.pop(node, {}):
            del self._unplayed_on[uid]

    def _unkeep(self, uid: str) -> None:
        node = self._unplayed_on.pop(uid, None)
        if node is not None:
            kept = self.unplayed[node]
            del kept[uid]
            if not kept:
                del self.unplayed[node]

    def node_recovered(self, node: str) -> None:
        """``node`` is Ready again: write back the status of its pods that others changed
        meanwhile (the node-lifecycle controller's NotReady), after the same delay as any."""
        for uid in self._waiting.pop(node, ()):
            pod = self._pods.get(uid)
            if pod is not None:
                self._keep(pod, pod.own.node_ready(self._clock.now()))

    def _warn(self, facts: PodFacts, problems: Sequence[str]) -> None:
        for problem in problems:
            self._recorder.emit(kind="Pod", namespace=facts.namespace, name=facts.name,
                                uid=facts.uid, event_type="Warning", reason="InvalidAnnotation",
                                message=problem, host=facts.node)

    # -- planning -------------------------------------------------------------------------------

    def _stages(self, uid: str) -> Sequence[PodRule]:
        """The pod's rules: its fault entries', then the defaults."""
        return self._rules(self._faults.pod(uid)).pods

    def _plan(self, pod: _Pod) -> None:
        rule = stages.match_pod(self._stages(pod.facts.uid), pod.facts, pod.life)
        if rule is not None and rule.is_hold:
            rule = None  # a fault keeps the pod as it is until something changes
        pod.stage = rule
        facts = pod.facts
        if self._lives.waiting(facts):
            # A replayed controller's pod: nothing of its life is due before it took the
            # recorded one (its start delay and run time are the stages' inputs).
            pod.stage = None
            self._timers.schedule_at(facts.uid, self._lives.due(facts.uid))
            self._dispatcher.wake()
            return
        if rule is None:
            if self._unprepared(pod):
                self._prepare_at(pod)
            elif pod.own.heal_at is not None:
                self._timers.schedule_at(facts.uid, pod.own.heal_at)
                self._dispatcher.wake()
            elif facts.uid not in self._refresh:
                self._timers.cancel(facts.uid)
            return
        timing, seed = self._nodes.pod_timing(facts.node)
        pod.due = stages.pod_due(rule, facts, pod.life, timing, _draws(facts, seed))
        self._timers.schedule_at(facts.uid, pod.due if pod.own.heal_at is None
                                 else min(pod.due, pod.own.heal_at))
        self._dispatcher.wake()

    def _forget(self, uid: str) -> None:
        if self._usage is not None:
            self._usage.gone(uid, self._clock.now())
        pod = self._pods.pop(uid, None)
        if pod is not None and self._names.get((pod.facts.namespace, pod.facts.name)) == uid:
            del self._names[(pod.facts.namespace, pod.facts.name)]  # not its successor's
        self._on_life(uid)
        self._timers.cancel(uid)
        self._refresh.discard(uid)
        self._preparations.forget(uid)
        self._lives.forget(uid)
        if pod is not None:
            self._waiting.get(pod.facts.node, set()).discard(uid)
        if pod is not None and pod.life.ip is not None:
            self.addresses.release(pod.life.ip)

    # -- steps out ------------------------------------------------------------------------------

    def _due(self, uid: str) -> Coroutine[Any, Any, None] | None:
        pod = self._pods.get(uid)
        if pod is None:
            return None
        if self._lives.waiting(pod.facts):
            return self._take_life(pod)
        rule = pod.stage
        now = self._clock.now()
        staged = rule is not None and pod.due <= now
        due = staged or uid in self._refresh or (pod.own.heal_at is not None and
                                                 pod.own.heal_at <= now)
        if not due:
            if rule is None and self._unprepared(pod):
                return self._prepare(pod)
            self._plan(pod)  # a write back the watch made needless: the timer of what is due
            return None
        if rule is not None and rule.traceparent and staged:
            return self._traced_step(pod, rule)
        return self._step(pod)

    async def _traced_step(self, pod: _Pod, rule: PodRule) -> None:
        """A fault's stage, in the batch span of its entry's trace context."""
        facts = pod.facts
        with self._traces.writing(rule.traceparent, kind="Pod",
                                  name=f"{facts.namespace}/{facts.name}", stage=rule.name,
                                  entry=rule.entry):
            await self._step(pod)

    async def _step(self, pod: _Pod) -> None:
        facts = pod.facts
        path = f"/api/v1/namespaces/{facts.namespace}/pods/{facts.name}"
        rule = pod.stage
        refresh = facts.uid in self._refresh
        self._refresh.discard(facts.uid)
        before = pod.life
        after = before
        applied: list[PodRule] = []
        healing: float | None = None
        reported = False
        try:
            if rule is not None and rule.stage.effect.delete:
                await self._delete(path, facts)
                return
            healing = pod.own.writes()  # the write back this write also is, if one is due
            now = rfc3339(self._clock.now())
            if rule is not None and pod.due <= self._clock.now():
                timing, seed = self._nodes.pod_timing(facts.node)
                after, applied = stages.advance_pod(
                    rule, facts, before, self._stages(facts.uid), timing,
                    lambda: _draws(facts, seed), now=self._clock.now(), stamp=now,
                    allocate=self._allocate)
            ending = [done for done in applied if done.stage.effect.endFault and done.entry]
            if after is not before or refresh or not ending:
                # The uid makes the write conditional, as the kubelet's: a pod deleted and
                # made again under the same name (a StatefulSet's) never gets the old one's
                # status.
                await self.client.send(requests.patch(
                    f"{path}/status", {"metadata": {"uid": facts.uid},
                                       "status": render_status(facts, after, now)},
                    decode=False))
                reported = True
        except NotFound:
            self._release_unwritten(before, after)
            self._forget(facts.uid)
            return
        except K8sError as error:
            self._release_unwritten(before, after)
            self._traces.failed(error)
            if isinstance(error, Invalid) and "metadata.uid" in error.message:
                self._forget(facts.uid)  # replaced: the watch brings the new pod
                return
            self._written(pod, reported=False, healing=healing)
            pod.failures += 1
            delay = min(RETRY_BASE * 2 ** (pod.failures - 1), RETRY_MAX)
            logger.debug("engine %s: %s on %s/%s failed (retry in %.0fs): %s", self.cluster,
                         rule.name if rule else "refresh", facts.namespace, facts.name, delay,
                         error)
            if refresh:
                self._refresh.add(facts.uid)
            if facts.uid in self._pods:
                self._timers.schedule(facts.uid, delay)
                self._dispatcher.wake()
            return
        except BaseException:
            pod.own.stopped()  # a defect (the dispatcher tries again) or a stop
            raise
        pod.failures = 0
        for done in ending:
            self._faults.finished(done.entry, done.state, "Pod", facts.uid)
        if after is not before:
            pod.life = after  # committed: the status says so now
            pod.own.expected = None
            if self._usage is not None:
                self._usage.lived(facts.uid, after, self._clock.now())
            self._on_life(facts.uid)
            for done in applied:
                for event in done.stage.effect.events:
                    self._recorder.emit(kind="Pod", namespace=facts.namespace, name=facts.name,
                                        uid=facts.uid, event_type=event.type,
                                        reason=event.reason, message=event.message,
                                        host=facts.node)
        if facts.uid in self._pods:
            self._written(pod, reported=reported, healing=healing)
            self._plan(pod)
            if facts.uid in self._refresh and facts.uid not in self._timers:
                self._timers.schedule(facts.uid, 0.0)  # a readiness gate flipped meanwhile
                self._dispatcher.wake()

    def _written(self, pod: _Pod, *, reported: bool, healing: float | None) -> None:
        self._keep(pod, pod.own.written(reported=reported, healing=healing,
                                        expected=lambda: self._expected(pod),
                                        **self._judging(pod)))

    # -- ResourceClaims (DRA) ----------------------------------------------------------------

    @staticmethod
    def _unprepared(pod: _Pod) -> bool:
        """The pod waits to start until its claims are known to be reserved for it."""
        facts = pod.facts
        return facts.claims_prepared is not True and pod.life.phase == podlife.PENDING and \
            not facts.deleting

    def _prepare_at(self, pod: _Pod) -> None:
        """Look at the pod's claims when due (:class:`~operators.engine.preparing.
        Preparations` says when)."""
        self._timers.schedule_at(pod.facts.uid, self._preparations.due(pod.facts.uid))
        self._dispatcher.wake()

    async def _prepare(self, pod: _Pod) -> None:
        await self._preparations.prepare(pod.facts)
        if self._pods.get(pod.facts.uid) is not pod:
            self._preparations.forget(pod.facts.uid)  # gone while its claims were read
            return
        self._plan(pod)

    async def _take_life(self, pod: _Pod) -> None:
        await self._lives.take(pod.facts)
        if self._pods.get(pod.facts.uid) is pod:
            self._plan(pod)  # with its life, or again after the back-off

    def _release_unwritten(self, before: PodLife, after: PodLife) -> None:
        if after.ip is not None and after.ip != before.ip:
            self.addresses.release(after.ip)  # allocated for a write that did not happen

    def _allocate(self, facts: PodFacts) -> str:
        slot = self._nodes.node_slot(facts.node)
        return self.addresses.allocate(slot if slot is not None else 0)

    async def _delete(self, path: str, facts: PodFacts) -> None:
        options = requests.delete_options(grace_period=0, uid=facts.uid)
        # NotFound: gone already; Conflict: replaced by a new pod of the same name.
        with contextlib.suppress(NotFound, Conflict):
            await self.client.send(requests.delete(path, body=options, decode=False))
        # Finalizers may keep the object a while; its DELETED event makes us forget it.
        pod = self._pods.get(facts.uid)
        if pod is not None:
            pod.stage = None


def _draws(facts: PodFacts, seed: int) -> random.Random:
    """The pod's own random draws (jitter): the same seed and pod give the same timings."""
    return random.Random(f"{seed}:{facts.seed or facts.namespace + '/' + facts.name}")
