"""The fake kubelet of one member cluster: it keeps the nodes of its pools present, Ready and
heartbeating.

Design for scale: node state is a small slotted record per node (no Node objects kept), all
timers live in one :class:`~operators.engine.queues.DelayQueue`, requests go through one bounded
connection pool, and a node's status is rewritten rarely: liveness travels through its Lease,
renewed every quarter of the lease duration as the kubelet does, with renewals spread so that
they do not all land at once.

Per engine: one *watch* of its nodes (the observed state, never re-listed while the watch
holds), *reconcile* (on a pool change, a node deleted by someone else, or every ``resync``
seconds: :func:`~operators.engine.nodes.plan` against the watched nodes, apply), *heartbeat*
(renew due leases, refresh due node statuses) and the pod half
(:mod:`~operators.engine.lifecycle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from operators.api.durations import parse_duration
from operators.api.nodepools import FakeNodePoolSpec
from operators.engine import nodes
from operators.engine.dispatching import Dispatcher
from operators.engine.lifecycle import PodLifecycle
from operators.engine.queues import DelayQueue
from operators.engine.stages import Timing
from operators.engine.watching import list_and_watch
from operators.k8s.client import STRATEGIC_PATCH, Client
from operators.k8s.errors import Conflict, K8sError, NotFound
from operators.k8s.times import micro_time, rfc3339

logger = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
NODES = "/api/v1/nodes"
RENEW_FRACTION = 0.25  # the kubelet renews its lease every quarter of its duration
STATUS_REPORT_INTERVAL = 300.0  # the kubelet's nodeStatusReportFrequency with leases
RETRY_DELAY = 1.0


def pod_timing(spec: FakeNodePoolSpec) -> Timing:
    """The pool's pod timing, in seconds."""
    behaviour = spec.pods
    return Timing(
        start_delay=parse_duration(behaviour.startDelay),
        start_jitter=parse_duration(behaviour.startJitter),
        init_delay=parse_duration(behaviour.initDelay),
        job_run_time=parse_duration(behaviour.jobRunTime),
        job_run_jitter=parse_duration(behaviour.jobRunJitter),
        grace_cap=parse_duration(behaviour.terminationGracePeriodCap),
    )


class NodeState:
    """What the engine remembers of one node: a few words, not the object."""

    __slots__ = ("lease_duration", "leased", "pool", "ready", "renew_at", "slot", "uid")

    def __init__(self, pool: str, slot: int, uid: str, lease_duration: int) -> None:
        self.pool = pool
        self.slot = slot
        self.uid = uid
        self.lease_duration = lease_duration
        self.ready = False
        self.leased = True  # False: the node is new, its Lease does not exist yet
        self.renew_at = 0.0  # when the next renewal is due (0: unknown)


@dataclasses.dataclass(frozen=True)
class PoolCounts:
    replicas: int
    ready: int


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    concurrency: int = 32
    pod_concurrency: int = 64
    heartbeat_connections: int = 48
    resync_interval: float = 30.0
    status_interval: float = STATUS_REPORT_INTERVAL
    heartbeat_batch: int = 256
    #: Heartbeats this late (seconds past due) hold the pod lifecycle back until they catch
    #: up: a renewal at twice the kubelet's interval, still far inside the node-lifecycle
    #: controller's 50 s grace (node-monitor-grace-period).
    heartbeat_slack: float = 10.0


class ClusterEngine:
    """Nodes of one member cluster; :meth:`run` until cancelled."""

    def __init__(
        self,
        cluster: str,
        client: Client,
        *,
        settings: EngineSettings | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.cluster = cluster
        self.client = client
        self.settings = settings or EngineSettings()
        self._clock = clock
        self._rng = rng or random.Random()
        self._pools: dict[str, FakeNodePoolSpec] = {}
        self._draining = False  # the cluster is going: no pool comes back
        self._timings: dict[str, Timing] = {}
        self._nodes: dict[str, NodeState] = {}
        self._slots_used: set[int] = set()
        self._slot_hint = 0  # no free slot below it
        self._observed: dict[str, nodes.ObservedNode] = {}  # from the node watch
        self._listed = asyncio.Event()
        self._timers: DelayQueue[tuple[str, str]] = DelayQueue(clock)
        self._dirty = asyncio.Event()
        # Heartbeats have connections of their own: pod churn must never delay a renewal
        # past the node-monitor grace period.
        self.heartbeat_client = client.clone(connections=self.settings.heartbeat_connections)
        self._heartbeats = Dispatcher(self._timers, self._due_beat,
                                      limit=self.settings.heartbeat_connections,
                                      batch=self.settings.heartbeat_batch,
                                      name=f"engine {cluster}: heartbeats")
        self._gate = asyncio.Semaphore(self.settings.concurrency)
        self.kubelet_version = ""
        self.synced = asyncio.Event()
        self.heartbeat_lag = 0.0  # how late the latest renewal went out
        self.pods = PodLifecycle(cluster, client, self, clock=clock,
                                 concurrency=self.settings.pod_concurrency,
                                 throttle=self.heartbeats_behind)

    # -- desired state, from the operator -------------------------------------------------

    def set_pool(self, pool: str, spec: FakeNodePoolSpec) -> None:
        if not self._draining and self._pools.get(pool) != spec:
            self._pools[pool] = spec
            self._timings[pool] = pod_timing(spec)
            self._dirty.set()

    def remove_pool(self, pool: str) -> None:
        if self._pools.pop(pool, None) is not None:
            self._timings.pop(pool, None)
            self._dirty.set()

    def drain(self) -> None:
        """Delete every node of every pool, and refuse pools from now on."""
        self._draining = True
        self._pools.clear()
        self._timings.clear()
        self._dirty.set()

    def heartbeats_behind(self) -> bool:
        """True while Lease renewals go out more than ``heartbeat_slack`` late."""
        return self.heartbeat_lag > self.settings.heartbeat_slack

    def counts(self, pool: str) -> PoolCounts:
        members = [state for state in self._nodes.values() if state.pool == pool]
        return PoolCounts(len(members), sum(1 for state in members if state.ready))

    def totals(self) -> PoolCounts:
        return PoolCounts(len(self._nodes), sum(1 for s in self._nodes.values() if s.ready))

    async def close(self) -> None:
        """Release the engine's connections (after :meth:`run` was cancelled)."""
        await self.client.close()
        await self.heartbeat_client.close()

    # -- the loops --------------------------------------------------------------------------

    async def run(self) -> None:
        version = await self.client.get("/version")
        self.kubelet_version = str(version.get("gitVersion", ""))
        self._dirty.set()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._watch_nodes(), name=f"engine:{self.cluster}:nodes")
            group.create_task(self._reconcile_loop(), name=f"engine:{self.cluster}:reconcile")
            group.create_task(self._heartbeats.run(), name=f"engine:{self.cluster}:heartbeat")
            group.create_task(self._pod_loop(), name=f"engine:{self.cluster}:pods")

    async def _pod_loop(self) -> None:
        await self.synced.wait()  # pods are matched to nodes the engine already knows
        await self.pods.run()

    # -- what the pod half asks of the nodes ------------------------------------------------

    def node_slot(self, node: str) -> int | None:
        state = self._nodes.get(node)
        return state.slot if state is not None else None

    def node_ip(self, node: str) -> str:
        state = self._nodes.get(node)
        return nodes.node_ip(state.slot) if state is not None else ""

    def pod_timing(self, node: str) -> tuple[Timing, int]:
        state = self._nodes.get(node)
        spec = self._pools.get(state.pool) if state is not None else None
        if spec is None or state is None:
            return Timing(), 0
        return self._timings[state.pool], spec.pods.seed

    async def _watch_nodes(self) -> None:
        await list_and_watch(self.client, NODES, {"labelSelector": nodes.MANAGED_SELECTOR},
                             on_list=self._nodes_listed, on_event=self._node_changed)

    def _nodes_listed(self, items: list[Any]) -> None:
        self._observed = {fact.name: fact for item in items if (fact := nodes.observe(item))}
        for name in [name for name in self._nodes if name not in self._observed]:
            self._forget(name)  # deleted while we were not watching
        for fact in self._observed.values():
            self._adopt(fact)
        self._listed.set()
        self._dirty.set()

    def _node_changed(self, kind: str, node: Any) -> None:
        fact = nodes.observe(node)
        if fact is None:
            return
        if kind == "DELETED":
            self._observed.pop(fact.name, None)
            if fact.name in self._nodes and fact.uid == self._nodes[fact.name].uid:
                self._forget(fact.name)
                self._dirty.set()  # deleted by someone else: recreate it if still wanted
            return
        self._observed[fact.name] = fact
        self._adopt(fact)

    def _adopt(self, fact: nodes.ObservedNode) -> None:
        """Take over a node of ours that the engine does not know (after a restart)."""
        if fact.name in self._nodes or fact.slot is None or fact.slot in self._slots_used:
            return
        spec = self._pools.get(fact.pool)
        duration = spec.leaseDurationSeconds if spec else 40
        state = NodeState(fact.pool, fact.slot, fact.uid, duration)
        state.ready = True
        self._remember(fact.name, state)
        self._schedule(("lease", fact.name), 0.0, spread=duration * RENEW_FRACTION)
        self._schedule(("status", fact.name), 0.0, spread=self.settings.status_interval)

    async def _reconcile_loop(self) -> None:
        await self._listed.wait()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.settings.resync_interval)
            self._dirty.clear()
            try:
                await self.reconcile()
                self.synced.set()
            except K8sError as error:
                logger.warning("engine %s: reconcile failed, retrying: %s", self.cluster, error)
                await asyncio.sleep(RETRY_DELAY)
                self._dirty.set()

    async def reconcile(self) -> None:
        """Plan from the watched nodes and apply. Idempotent; safe to run at any time."""
        actions = nodes.plan(self._pools, list(self._observed.values()))
        deletions = [a for a in actions if isinstance(a, nodes.Delete)]
        others = [a for a in actions if not isinstance(a, nodes.Delete)]
        await self._gather(self._delete(a.name) for a in deletions)
        await self._gather(self._apply(a) for a in others)

    async def _apply(self, action: nodes.Action) -> None:
        if isinstance(action, nodes.Create):
            await self._create(action.pool, action.index)
        elif isinstance(action, nodes.Reshape):
            await self._reshape(action.pool, action.index)

    async def _create(self, pool: str, index: int) -> None:
        spec = self._pools.get(pool)
        if spec is None:
            return
        name = nodes.node_name(pool, index)
        slot = self._allocate_slot()
        now = self._clock()
        body = nodes.render_node(self.cluster, pool, spec, index, slot, now=rfc3339(now),
                                 kubelet_version=self.kubelet_version)
        try:
            created = await self.client.create(NODES, body)
        except Conflict:
            self._slots_used.discard(slot)
            self._dirty.set()  # someone else has it: the next reconcile adopts it
            return
        except BaseException:
            self._slots_used.discard(slot)
            raise
        fact = nodes.observe(created)
        if fact is not None:  # before the watch reports it: the next plan must not recreate it
            self._observed[name] = fact
        state = NodeState(pool, slot, created["metadata"]["uid"], spec.leaseDurationSeconds)
        state.ready = True  # created with a Ready condition
        self._remember(name, state)
        self._schedule(("status", name), self.settings.status_interval,
                       spread=self.settings.status_interval)
        # Register, then hold a Lease, as the kubelet does: a node whose Lease waited behind
        # thousands of others would be marked NotReady before it ever renewed.
        try:
            await self._create_lease(self.client, name, state)
        except K8sError:
            state.leased = False  # the heartbeats create it
            state.renew_at = self._clock()
            self._schedule(("lease", name), 0.0)
            return
        self._schedule_renewal(name, state)

    async def _reshape(self, pool: str, index: int) -> None:
        spec = self._pools.get(pool)
        if spec is None:
            return
        name = nodes.node_name(pool, index)
        meta, status = nodes.reshape_patches(self.cluster, pool, spec, index)
        known = self._observed.get(name)
        if known is not None:
            self._observed[name] = dataclasses.replace(known,
                                                       template_hash=nodes.template_hash(spec))
        await self._ignore_missing(self.client.patch(f"{NODES}/{name}", meta))
        await self._ignore_missing(self.client.patch(f"{NODES}/{name}/status", status))

    async def _delete(self, name: str) -> None:
        self._forget(name)
        self._observed.pop(name, None)
        await self._ignore_missing(self.client.delete(f"{NODES}/{name}"))
        await self._ignore_missing(self.client.delete(f"{LEASES}/{name}"))

    def _due_beat(self, key: tuple[str, str]) -> Coroutine[Any, Any, None] | None:
        kind, name = key
        return self._beat(kind, name) if name in self._nodes else None

    async def _beat(self, kind: str, name: str) -> None:
        state = self._nodes.get(name)
        if state is None:
            return
        try:
            if kind == "lease":
                await self._renew_lease(name, state)
            else:
                await self._report_status(name)
                self._schedule(("status", name), self.settings.status_interval)
        except NotFound:
            if kind == "status":  # the node is gone: the next reconcile recreates it
                self._dirty.set()
        except K8sError as error:
            logger.debug("engine %s: %s %s failed: %s", self.cluster, kind, name, error)
            self._schedule((kind, name), RETRY_DELAY)

    async def _renew_lease(self, name: str, state: NodeState) -> None:
        """Renew (or create) the node's Lease, then schedule the next renewal."""
        started = self._clock()
        if state.renew_at:
            self.heartbeat_lag = max(0.0, started - state.renew_at)
        renewed = False
        if state.leased:  # a missing Lease is created straight away, no PATCH to fail first
            try:
                await self.heartbeat_client.patch(
                    f"{LEASES}/{name}", {"spec": {"renewTime": micro_time(started)}},
                    decode=False)
                renewed = True
            except NotFound:
                pass
        if not renewed:
            await self._create_lease(self.heartbeat_client, name, state)
        self._schedule_renewal(name, state)

    async def _create_lease(self, client: Client, name: str, state: NodeState) -> None:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name, "namespace": LEASE_NAMESPACE,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                     "uid": state.uid}],
            },
            "spec": {"holderIdentity": name, "leaseDurationSeconds": state.lease_duration,
                     "renewTime": micro_time(self._clock())},
        }
        with contextlib.suppress(Conflict):  # there already: the next renewal patches it
            await client.create(LEASES, lease, decode=False)
        state.leased = True

    def _schedule_renewal(self, name: str, state: NodeState) -> None:
        # +-4% jitter keeps renewals from bunching up again over time.
        interval = state.lease_duration * RENEW_FRACTION * self._rng.uniform(0.96, 1.04)
        state.renew_at = self._clock() + interval
        self._schedule(("lease", name), interval)

    async def _report_status(self, name: str) -> None:
        now = rfc3339(self._clock())
        await self.heartbeat_client.patch(
            f"{NODES}/{name}/status", {"status": {"conditions": nodes.node_conditions(now)}},
            content_type=STRATEGIC_PATCH, decode=False,
        )

    # -- bookkeeping ------------------------------------------------------------------------

    def _schedule(self, key: tuple[str, str], delay: float, *, spread: float = 0.0) -> None:
        self._timers.schedule(key, delay + (self._rng.uniform(0, spread) if spread else 0.0))
        self._heartbeats.wake()

    def _remember(self, name: str, state: NodeState) -> None:
        self._nodes[name] = state
        self._slots_used.add(state.slot)

    def _forget(self, name: str) -> None:
        state = self._nodes.pop(name, None)
        if state is not None:
            self._slots_used.discard(state.slot)
            self._slot_hint = min(self._slot_hint, state.slot)
        self._timers.cancel(("lease", name))
        self._timers.cancel(("status", name))

    def _allocate_slot(self) -> int:
        for slot in range(self._slot_hint, nodes.MAX_NODES_PER_CLUSTER):
            if slot not in self._slots_used:
                self._slots_used.add(slot)
                self._slot_hint = slot + 1
                return slot
        raise K8sError(
            f"cluster {self.cluster} has no free pod CIDR left "
            f"({nodes.MAX_NODES_PER_CLUSTER} nodes at most)"
        )

    async def _gather(self, calls: Iterable[Awaitable[None]]) -> None:
        async def gated(call: Awaitable[None]) -> None:
            async with self._gate:
                await call

        results = await asyncio.gather(*(gated(call) for call in calls), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    @staticmethod
    async def _ignore_missing(call: Awaitable[Any]) -> None:
        with contextlib.suppress(NotFound):
            await call
