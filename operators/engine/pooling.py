"""The pools an engine serves, and what it tells about them.

Served by the operator, an engine watches the FakeNodePools of its cluster in the host cluster
(``fieldSelector=spec.clusterRef=<cluster>``, one namespace) and writes their status itself:
``replicas`` are the nodes that exist, ``readyReplicas`` those whose Ready condition the member
API shows True, ``observedGeneration`` the spec the engine last acted on, and kstatus
conditions (Stalled with the reason when the pool cannot be reached; HeartbeatsAtRisk when
its Lease renewals come near the node-lifecycle controller's grace). Writes are coalesced (a
scale-up of a thousand nodes is a handful of status writes) and skipped when the status already
says it. Used alone (``--pool``), an engine serves the pools of its command line and writes
nothing.

Until the first list has arrived the desired pools are unknown, never empty: the engine plans
nothing before (a restarted engine must not delete every node of a pool it has not heard of
yet). A pool being deleted is served with zero replicas, so its nodes go before it does.

A pool's ``fakefleet.dev/held-nodes`` annotation (:func:`~operators.api.injections.read_held`)
names nodes a Delete fault keeps deleted: :attr:`Pools.held` gives them to the planner, which
deletes them and makes them again once no entry holds them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from operators.api.base import API_VERSION
from operators.api.injections import read_held, write_latency
from operators.api.nodepools import FakeNodePool, FakeNodePoolSpec
from operators.api.status import pool_status
from operators.engine.nodes import node_index
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.k8s.retrying import Backoff
from operators.k8s.times import rfc3339
from operators.k8s.watching import list_and_watch
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

STATUS_INTERVAL = 1.0


@dataclasses.dataclass(frozen=True)
class ClusterRef:
    """The FakeCluster an engine serves."""

    namespace: str
    name: str

    @property
    def pools_path(self) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/fakenodepools"

    @property
    def clusters_path(self) -> str:
        return f"/apis/{API_VERSION}/namespaces/{self.namespace}/fakeclusters"


class Pools:
    """Desired pools (from the host, or fixed) and their status (written to the host)."""

    def __init__(
        self,
        *,
        clock: Clock,
        counts: Callable[[str], tuple[int, int]],
        problem: Callable[[str], str],
        on_change: Callable[[], None],
        host: Client | None = None,
        cluster: ClusterRef | None = None,
        fixed: Mapping[str, FakeNodePoolSpec] | None = None,
        interval: float = STATUS_INTERVAL,
        on_latency: Callable[[float], None] | None = None,
        heartbeats: Callable[[str], tuple[bool, str] | None] = lambda _: None,
    ) -> None:
        """``heartbeats``: a pool's HeartbeatsAtRisk (status, message), None if it has none
        (:meth:`~operators.engine.alerting.GapAlarm.condition`)."""
        self._clock = clock
        self._heartbeats = heartbeats
        self._on_latency = on_latency
        self._counts = counts
        self._problem = problem
        self._on_change = on_change
        self._host = host
        self._cluster = cluster
        self._interval = interval
        self._objects: dict[str, FakeNodePool] = {}
        self._desired: dict[str, FakeNodePoolSpec] = dict(fixed or {})
        self._held: dict[str, frozenset[str]] = {}
        self._acted: dict[str, int] = {}  # the generation each pool's nodes were planned for
        self._dirty = asyncio.Event()
        self.known = asyncio.Event()
        if host is None:
            self.known.set()

    @property
    def desired(self) -> dict[str, FakeNodePoolSpec]:
        return dict(self._desired)

    @property
    def held(self) -> dict[str, frozenset[str]]:
        """Per pool, the node names a Delete fault holds (only those of the pool's own)."""
        return dict(self._held)

    def spec(self, pool: str) -> FakeNodePoolSpec | None:
        return self._desired.get(pool)

    def acted(self, specs: Mapping[str, FakeNodePoolSpec]) -> None:
        """The engine planned for these specs: their generations are observed."""
        for name, spec in specs.items():
            pool = self._objects.get(name)
            if pool is not None and _served(pool) == spec:
                self._acted[name] = int(pool.metadata.get("generation", 0))
        self.touch()

    def touch(self) -> None:
        """Counts may have changed: write statuses soon."""
        self._dirty.set()

    async def run(self) -> None:
        if self._host is None or self._cluster is None:
            return
        async with asyncio.TaskGroup() as group:
            group.create_task(list_and_watch(
                self._host, self._cluster.pools_path,
                {"fieldSelector": f"spec.clusterRef={self._cluster.name}"},
                on_list=self._relisted, on_event=self._changed, clock=self._clock))
            group.create_task(self._report())
            if self._on_latency is not None:
                # The FakeCluster itself: an APIServerSlow fault's entry slows our writes.
                group.create_task(list_and_watch(
                    self._host, self._cluster.clusters_path,
                    {"fieldSelector": f"metadata.name={self._cluster.name}"},
                    on_list=self._cluster_listed, on_event=self._cluster_changed,
                    clock=self._clock))

    def _cluster_listed(self, items: list[Any]) -> None:
        for item in items:
            self._cluster_changed("ADDED", item)

    def _cluster_changed(self, kind: str, obj: Any) -> None:
        if self._on_latency is not None:
            self._on_latency(0.0 if kind == "DELETED" else
                             write_latency(obj["metadata"].get("annotations")))

    # -- the host's pools in ------------------------------------------------------------------

    def _relisted(self, items: list[Any]) -> None:
        self._objects = {}
        for item in items:
            self._take(item)
        self._update()
        self.known.set()

    def _changed(self, kind: str, obj: Any) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self._objects.pop(name, None)
            self._acted.pop(name, None)
        else:
            self._take(obj)
        self._update()

    def _take(self, obj: Any) -> None:
        try:
            self._objects[obj["metadata"]["name"]] = FakeNodePool.model_validate(obj)
        except ValidationError as error:  # the CRD's schema is the model's: should not happen
            logger.error("pool %s cannot be read, ignored: %s", obj["metadata"]["name"], error)

    def _update(self) -> None:
        desired = {name: _served(pool) for name, pool in self._objects.items()}
        held = {name: names for name, pool in self._objects.items() if (names := _held(pool))}
        if desired != self._desired or held != self._held:
            self._desired = desired
            self._held = held
            self._on_change()
        self.touch()

    # -- status out ---------------------------------------------------------------------------

    async def _report(self) -> None:
        backoff = Backoff(base=1.0, cap=30.0)
        while True:
            await self._dirty.wait()
            await self._clock.sleep(self._interval)  # coalesce a burst of changes
            self._dirty.clear()
            failed: list[K8sError] = []
            for name in list(self._objects):  # one pool's failure does not hold back the rest
                try:
                    await self._write(name)
                except K8sError as error:
                    logger.warning("writing the status of pool %s failed: %s", name, error)
                    failed.append(error)
            if not failed:
                backoff.reset()
                continue
            delay = backoff.next()
            logger.warning("retrying %d pool status writes in %.1fs", len(failed), delay)
            self._dirty.set()
            await self._clock.sleep(delay)

    async def _write(self, name: str) -> None:
        pool = self._objects.get(name)
        if pool is None or self._cluster is None:
            return
        replicas, ready = self._counts(name)
        status = pool_status(pool, replicas=replicas, ready=ready,
                             generation=self._acted.get(name, 0),
                             now=rfc3339(self._clock.now()), problem=self._problem(name),
                             heartbeats=self._heartbeats(name))
        if status == pool.status:
            return
        try:
            await self._host.patch(  # type: ignore[union-attr]
                f"{self._cluster.pools_path}/{name}/status",
                {"status": status.model_dump(mode="json")})
        except NotFound:
            return  # deleted meanwhile
        # Committed: the next comparison is against what was written (the watch confirms),
        # unless the watch brought a newer object (or its deletion) during the write.
        if self._objects.get(name) is pool:
            self._objects[name] = pool.model_copy(update={"status": status})


def _held(pool: FakeNodePool) -> frozenset[str]:
    name = pool.metadata["name"]
    return frozenset(node for names in read_held(pool.metadata.get("annotations")).values()
                     for node in names if node_index(name, node) is not None)


def _served(pool: FakeNodePool) -> FakeNodePoolSpec:
    """The spec the engine serves: a pool being deleted has no nodes left to keep."""
    if pool.metadata.get("deletionTimestamp"):
        return pool.spec.model_copy(update={"replicas": 0})
    return pool.spec
