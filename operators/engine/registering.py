"""Nodes in and out of the member cluster: the executor of :func:`operators.engine.nodes.plan`.

Create registers a node with its status (nodes accept status on create) and then its Lease;
reshape patches an existing node to its pool's current template; delete removes the node and
its Lease; take gives a node a provisioner (Karpenter) made a pod CIDR and a kubelet's status,
then its Lease (:func:`operators.engine.nodes.take_patches`), and once such a node is gone its
Lease goes too (the engine never deletes the node itself). Every outcome is committed to the
book only after the API confirmed it: a node is forgotten once its DELETE succeeded (or found
it gone), played once its POST (or its take's status PATCH) succeeded. A POST answered
AlreadyExists adopts the node if it is the engine's own (an earlier answer was lost), and
reports it otherwise.

What keeps a pool from its replicas (no pod CIDR left, a name held by a foreign node) is kept
per pool in :attr:`Registrar.problems`, for the pool's Stalled condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Iterable, Mapping
from collections.abc import Set as AbstractSet

from operators.api.nodepools import FakeNodePoolSpec, pool_selector
from operators.engine import nodes
from operators.engine.heartbeating import LEASES, NODES, Heartbeats
from operators.engine.inventory import DEFAULT_LEASE_SECONDS, NodeBook, NodeRecord
from operators.k8s import requests
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound, TransportError, transient
from operators.k8s.times import rfc3339
from operators.k8s.watching import list_all
from primitives import keys
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

BURST = 100  # more node writes than this at once load the API server


class Registrar:
    """Creates, reshapes and deletes one cluster's fake nodes."""

    def __init__(self, cluster: str, client: Client, book: NodeBook, heartbeats: Heartbeats,
                 *, clock: Clock, concurrency: int) -> None:
        self.cluster = cluster
        self.client = client
        self._book = book
        self._heartbeats = heartbeats
        self._clock = clock
        self._gate = asyncio.Semaphore(concurrency)
        self.kubelet_version = ""
        #: The port the engine serves its nodes' kubelet endpoints on (their daemonEndpoints).
        self.kubelet_port = nodes.KUBELET_PORT
        self.problems: dict[str, str] = {}
        self._found: dict[str, str] = {}  # this round's, while it runs
        self.busy = False  # a burst of node writes is under way

    async def reconcile(self, desired: Mapping[str, FakeNodePoolSpec],
                        held: Mapping[str, AbstractSet[str]] | None = None) -> bool:
        """Plan from the book and apply; True when every action succeeded. Idempotent.
        ``held``: per pool, the node names a Delete fault keeps deleted."""
        self._book.lease_seconds = {pool: spec.leaseDurationSeconds
                                    for pool, spec in desired.items()}
        actions = nodes.plan(desired, list(self._book.facts.values()), held,
                             kubelet_port=self.kubelet_port)
        # Problems found in this round replace the last round's only when it is over, so the
        # pool status never sees a problem vanish for the length of a round.
        self._found = self._name_conflicts(desired)
        deletions = [a for a in actions if isinstance(a, nodes.Delete)]
        others = [a for a in actions if not isinstance(a, nodes.Delete)]
        self.busy = len(actions) > BURST
        try:
            done = await self._gather(self._release(name) for name in list(self._book.released))
            done &= await self._gather(self._delete(a.name) for a in deletions)
            done &= await self._gather(self._apply(a, desired) for a in others)
        finally:
            self.busy = False
            self.problems = self._found
        return done

    def _name_conflicts(self, desired: Mapping[str, FakeNodePoolSpec]) -> dict[str, str]:
        problems: dict[str, str] = {}
        for pool, spec in desired.items():
            taken = sorted(
                (nodes.node_index(pool, facts.name), facts.name)
                for facts in self._book.facts.values()
                if facts.foreign and (index := nodes.node_index(pool, facts.name)) is not None
                and index < spec.engine_replicas)
            if taken:
                names = ", ".join(name for _, name in taken[:5])
                problems[pool] = (f"{len(taken)} of its node names are held by nodes this "
                                  f"engine did not make ({names}): delete them, or give the "
                                  f"pool another name")
        return problems

    async def _apply(self, action: nodes.Action, desired: Mapping[str, FakeNodePoolSpec]) -> bool:
        if isinstance(action, nodes.Create):
            return await self._create(action.pool, desired[action.pool], action.index)
        if isinstance(action, nodes.Reshape):
            return await self._reshape(action.pool, desired[action.pool], action.index)
        if isinstance(action, nodes.Take):
            return await self._take(action.pool, action.name, desired.get(action.pool))
        return True

    async def _create(self, pool: str, spec: FakeNodePoolSpec, index: int) -> bool:
        name = nodes.node_name(pool, index)
        slot = self._book.allocate_slot(name)
        if slot is None:
            self._found[pool] = (
                f"the cluster's pod network ({nodes.POD_NETWORK}, a /24 per node) has room for "
                f"{nodes.MAX_NODES_PER_CLUSTER} nodes across all its pools, and it is full: "
                f"lower the replicas of this or another pool")
            return True  # nothing to retry until a pool changes
        now = self._clock.now()
        life = nodes.healthy_life(rfc3339(now))
        body = nodes.render_node(self.cluster, pool, spec, index, slot, life=life,
                                 kubelet_version=self.kubelet_version,
                                 kubelet_port=self.kubelet_port)
        try:
            created = await self.client.create(NODES, body)
        except Conflict as error:
            if error.already_exists:
                return await self._adopt(pool, name)  # keeps the slot if it is ours, with it
            self._book.release_slot(name)
            return False
        except TransportError as error:  # no answer: the node may exist, with this slot
            logger.debug("engine %s: creating %s got no answer: %s", self.cluster, name, error)
            return False
        except K8sError as error:
            self._book.release_slot(name)
            logger.debug("engine %s: creating %s failed: %s", self.cluster, name, error)
            return False
        record = NodeRecord(pool, slot, created["metadata"]["uid"], spec.leaseDurationSeconds,
                            life)
        record.renew_at = now  # its Lease comes next, from here
        self._book.created(name, created, record)
        await self._heartbeats.create_lease(name, record)
        return True

    async def _adopt(self, pool: str, name: str) -> bool:
        """A POST found the name taken: take the node if it is ours, report it if not."""
        try:
            existing = await self.client.get(f"{NODES}/{name}")
        except K8sError as error:
            logger.debug("engine %s: reading %s failed: %s", self.cluster, name, error)
            return False
        self._book.changed("ADDED", existing)  # as if the watch had shown it: adopt or report
        if name not in self._book.records:
            self._book.release_slot(name)  # someone else's: its slot was never used
            # Not ours (made by someone else, or ours with the pool label taken off): retrying
            # cannot help, so the pool says why it stays short until the node goes.
            self._found.setdefault(pool, (
                f"node {name} exists and was not made by this engine (or lost its {keys.POOL} "
                f"label): delete it, or give the pool another name"))
        return True

    async def _reshape(self, pool: str, spec: FakeNodePoolSpec, index: int) -> bool:
        name = nodes.node_name(pool, index)
        record = self._book.records.get(name)
        if record is None:
            return True  # not played (gone meanwhile): nothing to reshape
        try:
            observed = await self.client.get(f"{NODES}/{name}")
            meta, status = nodes.reshape_patches(self.cluster, pool, spec, index, observed,
                                                 slot=record.slot,
                                                 kubelet_port=self.kubelet_port)
            await self.client.patch(f"{NODES}/{name}", meta)
            await self.client.patch(f"{NODES}/{name}/status", status)
        except NotFound:
            return True  # gone: the watch says so, and the next plan creates it
        except K8sError as error:
            logger.debug("engine %s: reshaping %s failed: %s", self.cluster, name, error)
            return False
        facts = self._book.facts.get(name)
        if facts is not None:  # committed: the next plan must not reshape it again
            self._book.facts[name] = dataclasses.replace(
                facts, template_hash=nodes.template_hash(spec),
                kubelet=(nodes.node_ip(record.slot), self.kubelet_port))
        # Its next Lease renewal carries the new duration.
        record.lease_duration = spec.leaseDurationSeconds
        record.leased = False
        return True

    async def _take(self, pool: str, name: str, spec: FakeNodePoolSpec | None) -> bool:
        """Play a node a provisioner made: a slot first (written as its pod CIDR, which the
        API lets be set once), then a kubelet's status, then its Lease."""
        facts = self._book.facts.get(name)
        if facts is None:
            return True  # gone meanwhile
        slot = facts.slot if facts.slot is not None else self._book.allocate_slot(name)
        if slot is None:
            self._found[pool] = (
                f"the cluster's pod network ({nodes.POD_NETWORK}, a /24 per node) has room for "
                f"{nodes.MAX_NODES_PER_CLUSTER} nodes across all its pools, and it is full: "
                f"Karpenter's node {name} is not played")
            return True
        now = self._clock.now()
        # Conditions only the first time: later, a fault's NotReady is the node's truth.
        life = nodes.healthy_life(rfc3339(now)) if not facts.ready else None
        meta, status = nodes.take_patches(self.cluster, facts, slot,
                                          kubelet_version=self.kubelet_version,
                                          kubelet_port=self.kubelet_port, life=life)
        written_cidr = not meta
        self._book.taking(name)
        try:
            try:
                if meta:
                    await self.client.patch(f"{NODES}/{name}", meta)
                    written_cidr = True
                written = await self.client.patch(f"{NODES}/{name}/status", status)
            except NotFound:
                self._book.release_slot(name)
                return True  # Karpenter deleted it meanwhile
            except K8sError as error:
                # Its slot stays reserved once its pod CIDR may be written (no answer, or the
                # status failed after it): the watch shows it with it, and the next plan
                # takes it again on that slot.
                if not written_cidr and not isinstance(error, TransportError):
                    self._book.release_slot(name)
                logger.debug("engine %s: taking %s failed: %s", self.cluster, name, error)
                return False
            record = self._book.records.get(name)
            if record is not None:  # played already (taken again: not as the engine makes it)
                self._book.wrote(name, life or record.life,
                                 nodes.observe(written, self.cluster))
                return True
            lease = spec.leaseDurationSeconds if spec is not None else \
                self._book.lease_seconds.get(pool, DEFAULT_LEASE_SECONDS)
            record = NodeRecord(pool, slot, written["metadata"]["uid"], lease,
                                life or nodes.life_from_node(written), provisioned=True)
            record.renew_at = now
            self._book.created(name, written, record)
        finally:
            self._book.took(name)
        await self._heartbeats.create_lease(name, record)
        return True

    async def _release(self, name: str) -> bool:
        """A provisioner's node is gone: its Lease goes with it (Karpenter deletes nodes, and
        the engine does not wait for the garbage collector)."""
        try:
            await self.client.delete(f"{LEASES}/{name}", decode=False)
        except NotFound:
            pass
        except K8sError as error:
            logger.debug("engine %s: deleting the lease of %s failed: %s", self.cluster, name,
                         error)
            return False
        self._book.released.discard(name)
        return True

    async def _delete(self, name: str) -> bool:
        facts = self._book.facts.get(name)
        options = requests.delete_options(uid=facts.uid if facts else None)
        try:
            await self.client.delete(f"{NODES}/{name}", body=options, decode=False)
        except (NotFound, Conflict):
            pass  # gone already, or a new node of that name that is not this one
        except K8sError as error:
            logger.debug("engine %s: deleting %s failed: %s", self.cluster, name, error)
            return False
        self._book.deleted(name)
        with contextlib.suppress(K8sError):  # else its owner reference lets the GC take it
            await self.client.delete(f"{LEASES}/{name}", decode=False)
        return True

    async def _gather(self, calls: Iterable[Awaitable[bool]]) -> bool:
        async def gated(call: Awaitable[bool]) -> bool:
            async with self._gate:
                return await call

        results = await asyncio.gather(*(gated(call) for call in calls))
        return all(results)


async def count_nodes(client: Client, cluster: str, pool: str | None = None) -> int:
    """How many of the engine's own nodes (of ``pool``, or of every pool) the API shows."""
    selector = pool_selector(pool) if pool is not None else nodes.MANAGED_SELECTOR
    _, items = await list_all(client, NODES, {"labelSelector": selector})
    return sum(1 for item in items if (facts := nodes.observe(item, cluster)) is not None
               and not facts.foreign)


async def remove_all(client: Client, cluster: str) -> int:
    """Delete every node the engine of ``cluster`` made (and its Lease), once that engine has
    stopped: an adopted cluster outlives its FakeCluster. Returns how many are left to retry;
    a refusal that retrying cannot mend (403: the kubeconfig may not delete nodes) is raised,
    so that the caller can say why."""
    _, items = await list_all(client, NODES, {"labelSelector": nodes.MANAGED_SELECTOR})
    left = 0
    for item in items:
        facts = nodes.observe(item, cluster)
        if facts is None or facts.foreign or facts.provisioned:
            continue  # a provisioner's nodes are its own to delete
        options = requests.delete_options(uid=facts.uid)
        try:
            await client.delete(f"{NODES}/{facts.name}", body=options, decode=False)
        except (NotFound, Conflict):
            pass
        except K8sError as error:
            if not transient(error):
                raise
            left += 1
            continue
        with contextlib.suppress(K8sError):
            await client.delete(f"{LEASES}/{facts.name}", decode=False)
    return left
