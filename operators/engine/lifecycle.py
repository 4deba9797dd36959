"""The pod half of the fake kubelet: pods bound to the engine's nodes live through the stages
of :mod:`operators.engine.stages`.

One watch for all pods (``spec.nodeName!=``, i.e. bound pods) instead of one per node: a field
selector per node would mean thousands of watches, and the API server offers no "nodeName in
set" selector; filtering bound pods by our node names on our side costs one dict lookup per
event. Every pod is a small :class:`~operators.engine.pods.PodFacts`; every timer sits in one
heap; a bounded number of requests run at once (a full pool waits, so a throttling API server
slows us down instead of piling requests up); each transition is one merge patch of the status
subresource, and an unchanged status is not sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from operators.engine import pods as podfacts
from operators.engine import stages
from operators.engine.addresses import PodAddresses
from operators.engine.dispatching import Dispatcher
from operators.engine.pods import PodFacts, render_status
from operators.engine.queues import DelayQueue
from operators.engine.stages import Phase, Stage, Step, Timing
from operators.engine.watching import list_and_watch
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound
from operators.k8s.times import parse, rfc3339

logger = logging.getLogger(__name__)

PODS = "/api/v1/pods"
BOUND = {"fieldSelector": "spec.nodeName!="}
RETRY_DELAY = 1.0


class NodeDirectory(Protocol):
    """What the pod half needs to know of the engine's nodes."""

    def node_slot(self, node: str) -> int | None: ...

    def node_ip(self, node: str) -> str: ...

    def pod_timing(self, node: str) -> tuple[Timing, int]: ...


class PodLifecycle:
    """Runs the lifecycle of every pod bound to one cluster's fake nodes."""

    def __init__(
        self,
        cluster: str,
        client: Client,
        nodes: NodeDirectory,
        *,
        clock: Callable[[], float] = time.time,
        concurrency: int = 64,
        batch: int = 512,
        pod_stages: tuple[Stage, ...] = stages.POD_STAGES,
        throttle: Callable[[], bool] | None = None,
    ) -> None:
        self.cluster = cluster
        self.client = client
        self._nodes = nodes
        self._clock = clock
        self._stages = pod_stages
        self._pods: dict[str, PodFacts] = {}
        self._due: dict[str, Stage] = {}
        self._timers: DelayQueue[str] = DelayQueue(clock)
        self._dispatcher = Dispatcher(self._timers, self._due_step, limit=concurrency,
                                      batch=batch, name=f"engine {cluster}: pods",
                                      throttle=throttle)
        self.addresses = PodAddresses()
        # Events telling users about annotations we ignored; bounded, and dropped when full
        # (the engine's log has them too), so a flood of bad pods never holds up the rest.
        self._warnings: asyncio.Queue[tuple[PodFacts, str]] = asyncio.Queue(maxsize=256)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(list_and_watch(self.client, PODS, BOUND, on_list=self._relisted,
                                             on_event=self._changed))
            group.create_task(self._dispatcher.run())
            group.create_task(self._send_warnings())

    # -- events in ------------------------------------------------------------------------

    def _relisted(self, items: list[Any]) -> None:
        present = {item["metadata"]["uid"] for item in items}
        for uid in [uid for uid in self._pods if uid not in present]:
            self._forget(uid)
        for item in items:
            self._changed("ADDED", item)

    def _changed(self, kind: str, pod: Any) -> None:
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self._forget(uid)
            return
        known = self._pods.get(uid)
        if known is not None:
            ready_before = known.gates_ready()
            if known.observe(pod):
                self._plan(known)
                if known.phase == podfacts.RUNNING and known.gates_ready() != ready_before:
                    self._schedule(known, None, 0.0)  # readiness gate flipped: re-report Ready
            return
        node = pod["spec"].get("nodeName")
        if node is None or self._nodes.node_slot(node) is None:
            return  # not on one of our nodes
        facts = PodFacts(pod)
        facts.host_ip = self._nodes.node_ip(node)
        self._adopt(facts, pod)
        self._pods[uid] = facts
        if facts.problems and facts.phase == podfacts.PENDING:  # new to us: warn once
            for problem in facts.problems:
                with contextlib.suppress(asyncio.QueueFull):
                    self._warnings.put_nowait((facts, problem))
        self._plan(facts)

    def _adopt(self, facts: PodFacts, pod: Any) -> None:
        """A pod that already went through stages (engine restart): carry on where it is."""
        status = pod.get("status") or {}
        phase = status.get("phase")
        if phase not in ("Running", "Succeeded", "Failed"):
            return
        facts.start_time = status.get("startTime")
        facts.changed_at = facts.start_time or ""
        containers = status.get("containerStatuses") or []
        if containers:
            state = containers[0].get("state") or {}
            facts.restarts = int(containers[0].get("restartCount", 0))
            facts.started_at = (state.get("running") or state.get("terminated") or {}).get(
                "startedAt", "") or ""
            facts.ready_since = facts.started_at
            if "waiting" in state and phase == "Running":
                facts.phase = podfacts.BACKOFF
                return
        if phase == "Running":
            facts.phase = podfacts.RUNNING
            if status.get("podIP"):
                facts.ip = status["podIP"]
                self.addresses.claim(facts.ip)
        else:
            facts.phase = phase

    # -- planning ---------------------------------------------------------------------------

    def _plan(self, facts: PodFacts) -> None:
        stage = stages.match(facts, Phase(facts.phase), self._stages)
        if stage is None:
            self._timers.cancel(facts.uid)
            self._due.pop(facts.uid, None)
            return
        timing, seed = self._nodes.pod_timing(facts.node)
        rng = random.Random(f"{seed}:{facts.seed or facts.namespace + '/' + facts.name}")
        wait = stages.delay(stage, facts, timing, rng)
        if stage.step is Step.EXIT and facts.started_at:
            wait -= max(0.0, self._clock() - parse(facts.started_at))  # adopted mid-run
        self._schedule(facts, stage, max(0.0, wait))

    def _schedule(self, facts: PodFacts, stage: Stage | None, wait: float) -> None:
        if stage is None:
            self._due.setdefault(facts.uid, _REFRESH)
        else:
            self._due[facts.uid] = stage
        self._timers.schedule(facts.uid, wait)
        self._dispatcher.wake()

    def _forget(self, uid: str) -> None:
        facts = self._pods.pop(uid, None)
        self._timers.cancel(uid)
        self._due.pop(uid, None)
        if facts is not None and facts.ip is not None:
            self.addresses.release(facts.ip)

    # -- steps out --------------------------------------------------------------------------

    def _due_step(self, uid: str) -> Coroutine[Any, Any, None] | None:
        stage = self._due.pop(uid, None)
        facts = self._pods.get(uid)
        if stage is None or facts is None:
            return None
        return self._fire(facts, stage)

    async def _fire(self, facts: PodFacts, stage: Stage) -> None:
        path = f"/api/v1/namespaces/{facts.namespace}/pods/{facts.name}"
        try:
            if stage.step is Step.DELETE:
                await self._delete(path, facts)
                return
            now = rfc3339(self._clock())
            if stage is not _REFRESH:  # a refresh is scheduled only when Ready really flips
                stages.advance(facts, stage.step, now, allocate=self._allocate)
            await self.client.patch(f"{path}/status", {"status": render_status(facts, now)},
                                    decode=False)
        except NotFound:
            self._forget(facts.uid)
            return
        except K8sError as error:
            logger.debug("engine %s: %s on %s/%s failed: %s", self.cluster, stage.name,
                         facts.namespace, facts.name, error)
            if facts.uid in self._pods:
                self._schedule(facts, stage, RETRY_DELAY)
            return
        if facts.uid in self._pods and facts.uid not in self._due:
            self._plan(facts)

    async def _send_warnings(self) -> None:
        while True:
            facts, problem = await self._warnings.get()
            event = podfacts.render_warning(facts, problem, rfc3339(self._clock()))
            try:
                await self.client.create(f"/api/v1/namespaces/{facts.namespace}/events", event)
            except K8sError as error:  # e.g. the namespace is going away: the log has it
                logger.debug("engine %s: event on %s/%s not sent: %s", self.cluster,
                             facts.namespace, facts.name, error)

    def _allocate(self, facts: PodFacts) -> str:
        slot = self._nodes.node_slot(facts.node)
        return self.addresses.allocate(slot if slot is not None else 0)

    async def _delete(self, path: str, facts: PodFacts) -> None:
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                   "preconditions": {"uid": facts.uid}}
        # NotFound: gone already; Conflict: replaced by a new pod of the same name.
        with contextlib.suppress(NotFound, Conflict):
            await self.client.delete(path, body=options, decode=False)
        # Finalizers may keep the object a while; its DELETED event makes us forget it.
        self._due.pop(facts.uid, None)


#: Marker stage: re-render and send the status if it changed (readiness gates), no step.
_REFRESH = Stage("refresh", frozenset(), frozenset(), stages.Timer.NONE, Step.START)
