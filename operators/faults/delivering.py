"""How a FaultPlan's faults reach their victims and leave them again: every write the plan makes
into the fleet, and the Events it sends about its victims.

A fault travels by one of three channels (:mod:`operators.api.injections`):

- a node's or a pod's own ``fakefleet.dev/faults`` annotation: an entry whose stages the
  victim's engine runs;
- a node Delete: the node's FakeNodePool (in the host) holds it deleted in its
  ``fakefleet.dev/held-nodes`` annotation, which the pool's engine obeys;
- a cluster fault: an entry on the FakeCluster (in the host), which the operator applies at
  once (``apply``: components stopped and started again), and the cluster's engine
  (APIServerSlow) or its hub link (HubPartition, HubLatency) obeys.

Delivery walks each entry through its life with the transitions of
:mod:`operators.api.injections`: written in state inject, turned to its recovery, removed once
the engine marked it done (a FakeCluster's entry is removed when its fault ends, and nobody
marks it done: it is recovered once it is gone and what it stopped runs again). Every write is
conditional on the resourceVersion it was computed from (:mod:`operators.k8s.patching`, read
again after a conflict) and carries the writing span's traceparent, in the entry and as the
object's ``fakefleet.dev/traceparent`` annotation, in one PATCH per victim. Victims are listed
once per cluster and kind (:meth:`Delivery.observe`), and written without being read first.

Delivery decides nothing about the plan (which victims, when, what the outcome means for the
status: :mod:`operators.faults.deciding`), and holds no progress of its own: what it wrote is
in the objects, and what the plan did in its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.faultplans import Fault
from operators.api.injections import (
    FaultEntry,
    hold_node,
    inject_entry,
    read_entries,
    read_held,
    recover_entry,
    recovery,
    release_node,
    remove_entry,
    render_entries,
    render_held,
)
from operators.faults import catalogue
from operators.faults.targets import Victim
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound, brief
from operators.k8s.events import render_event
from operators.k8s.patching import patch_until_current
from operators.k8s.times import rfc3339
from primitives import keys

logger = logging.getLogger(__name__)

BASE = f"/apis/{API_VERSION}/namespaces/{{namespace}}"
CLUSTERS = BASE + "/fakeclusters"
POOLS = BASE + "/fakenodepools"
#: Writes of one injection in flight at once, per member cluster.
CONCURRENCY = 64
CONFLICT_RETRIES = 8
#: Who the Events about victims say they come from.
REPORTER = "fakefleet-faultplan"

#: An edit of an object's fault entries, given the entries and the object as read.
Edit = Callable[[list[FaultEntry], dict[str, Any]], list[FaultEntry]]
#: Makes the operator obey a FakeCluster's entries now (components stopped, started again).
Apply = Callable[[str], Awaitable[None]]
#: Whether a control-plane component of a cluster runs (None: no local control plane of ours).
Running = Callable[[str, str], bool | None]


class Members(Protocol):
    """The plan's clusters, as the runner last listed them, and clients of their API servers."""

    async def clusters(self) -> Mapping[str, FakeCluster]:
        """List the FakeClusters again."""
        ...

    def cluster(self, name: str) -> FakeCluster | None: ...

    def member(self, name: str) -> Client | None:
        """A client of the cluster's API server (None: it cannot be reached yet)."""
        ...


@dataclasses.dataclass(frozen=True)
class Delivered:
    """What writing to every victim came to."""

    #: Victims that cannot take the fault, for good (gone, not ours, an adopted control plane).
    problems: list[str]
    #: API errors: those victims are to be written again.
    failed: list[str]


#: How a listed object is found again: (cluster, kind, namespace, name).
Seen = tuple[str, str, str, str]


class Delivery:
    """One plan's writes into the fleet, and the victims as the last list showed them."""

    def __init__(self, *, plan: str, namespace: str, host: Client, members: Members,
                 apply: Apply, running: Running) -> None:
        #: namespace/name, for the log.
        self.plan = plan
        self.namespace = namespace
        self.host = host
        self._members = members
        self._apply = apply
        self._running = running
        #: Victims as the last list showed them, so that a write can go out without reading
        #: each object first; and their uids (for Events about them).
        self._seen: dict[Seen, dict[str, Any]] = {}
        self._uids: dict[Seen, str] = {}

    # -- looking -------------------------------------------------------------------------------

    def remember(self, cluster: str, kind: str, item: dict[str, Any]) -> None:
        """Keep a listed node or pod, to write it without reading it again."""
        meta = item["metadata"]
        key = (cluster, kind, meta.get("namespace", ""), meta["name"])
        self._seen[key] = item
        self._uids[key] = meta.get("uid", "")

    async def look(self, victims: Sequence[Victim]) -> None:
        """List the victims unless the choice of them just did (victims recorded before a
        restart: look at them now)."""
        if not any(_seen(v) in self._seen for v in victims):
            await self.observe(victims)

    async def observe(self, victims: Sequence[Victim]) -> None:
        """List the FakeClusters and the victims' nodes and pods, one list per cluster and kind
        (not one read per victim: a step may hit thousands)."""
        await self._members.clusters()
        wanted: dict[tuple[str, str], set[str]] = {}
        for victim in victims:
            if victim.kind != "Cluster":
                wanted.setdefault((victim.cluster, victim.kind), set()).add(victim.namespace)
        for (cluster, kind), namespaces in wanted.items():
            client = self._members.member(cluster)
            if client is None:
                continue
            if kind == "Node":
                path = "/api/v1/nodes"
            elif len(namespaces) == 1:
                path = f"/api/v1/namespaces/{next(iter(namespaces))}/pods"
            else:
                path = "/api/v1/pods"
            for item in (await client.get(path)).get("items") or ():
                self.remember(cluster, kind, item)

    def _observed(self, victim: Victim) -> dict[str, Any] | None:
        """The victim as last listed, once: a later write of it reads it first."""
        return self._seen.pop(_seen(victim), None)

    # -- inject --------------------------------------------------------------------------------

    async def inject(self, fault: Fault, entry_id: str, victims: Sequence[Victim],
                     traceparent: str) -> Delivered:
        """Write entry ``entry_id`` of ``fault`` into every victim (idempotent by id), carrying
        ``traceparent``."""
        return await self._each(victims, lambda v: self._inject_one(fault, entry_id, v,
                                                                    traceparent))

    async def _inject_one(self, fault: Fault, entry_id: str, victim: Victim,
                          traceparent: str) -> str:
        if victim.kind == "Cluster":
            return await self._cluster_entry(victim.cluster, entry_id, add=fault,
                                             traceparent=traceparent)
        client = self._members.member(victim.cluster)
        if client is None:
            return f"{victim}: the cluster is not reachable"
        if victim.kind == "Pod":
            def add_pod(entries: list[FaultEntry], pod: dict[str, Any]) -> list[FaultEntry]:
                restarts = max((c.get("restartCount", 0) for c in (pod.get("status") or {})
                                .get("containerStatuses") or ()), default=0)
                return inject_entry(entries, _traced(catalogue.pod_entry(
                    entry_id, fault, restarts=catalogue.one_shot_restarts(entries, restarts)),
                    traceparent))
            return await edit_entries(client, _path(victim), add_pod, str(victim),
                                      self._observed(victim), traceparent=traceparent)
        if fault.type == "Delete":
            return await self._hold(victim, entry_id, hold=True, traceparent=traceparent)

        def add_node(entries: list[FaultEntry], node: dict[str, Any]) -> list[FaultEntry]:
            gpus, extended = catalogue.node_gpus(node)
            return inject_entry(entries, _traced(catalogue.node_entry(
                entry_id, fault, gpus=gpus, extended=extended), traceparent))
        return await edit_entries(client, _path(victim), add_node, str(victim),
                                  self._observed(victim), traceparent=traceparent)

    async def _hold(self, victim: Victim, entry_id: str, *, hold: bool,
                    traceparent: str = "") -> str:
        """Hold (or release) a deleted node in its pool, which the engine obeys."""
        client = self._members.member(victim.cluster)
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

        def change(current: dict[str, Any]) -> dict[str, Any] | None:
            annotations = current["metadata"].get("annotations") or {}
            held = read_held(annotations)
            edited = hold_node(held, entry_id, victim.name) if hold else \
                release_node(held, entry_id, victim.name)
            value = render_held(edited)
            if value == annotations.get(keys.HELD_NODES):
                return None
            return {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"],
                                 "annotations": _with_trace({keys.HELD_NODES: value},
                                                            traceparent)}}
        try:
            await patch_until_current(self.host, path, await self.host.get(path), change,
                                      _as_read, attempts=CONFLICT_RETRIES)
        except NotFound:
            return f"{victim}: FakeNodePool {pool} is gone"
        except Conflict:
            return f"{victim}: FakeNodePool {pool} kept changing; the hold was not written"
        return ""

    async def _pool_holding(self, entry_id: str) -> str:
        found = await self.host.get(POOLS.format(namespace=self.namespace))
        for item in found.get("items") or ():
            if entry_id in read_held(item["metadata"].get("annotations")):
                return str(item["metadata"]["name"])
        return ""

    async def _cluster_entry(self, cluster: str, entry_id: str, *, add: Fault | None = None,
                             traceparent: str = "") -> str:
        """Add (``add``: the fault) or remove the FakeCluster's entry, then apply it;
        ``traceparent``: the span the write is made for, in the entry and the annotation."""
        known = self._members.cluster(cluster)
        # A slowdown and the hub link's faults act on processes of ours: any cluster takes them.
        if add is not None and add.type in catalogue.COMPONENTS and known is not None and \
                known.spec.controlPlane.backend != "local":
            return (f"{cluster}: {add.type} needs a local control plane; this cluster is "
                    f"adopted (backend external), its processes are not ours")
        path = f"{CLUSTERS.format(namespace=self.namespace)}/{cluster}"

        def edit(entries: list[FaultEntry], _: dict[str, Any]) -> list[FaultEntry]:
            if add is None:
                return remove_entry(entries, entry_id)
            return inject_entry(entries, _traced(catalogue.cluster_entry(entry_id, add),
                                                 traceparent))
        problem = await edit_entries(self.host, path, edit, f"FakeCluster {cluster}",
                                     traceparent=traceparent)
        if problem:
            return problem
        await self._apply(cluster)
        return ""

    # -- recover -------------------------------------------------------------------------------

    async def recover(self, fault: Fault, entry_id: str, victims: Sequence[Victim],
                      traceparent: str) -> Delivered:
        """Turn every victim's entry to its recovery (release a Delete's holds, remove a
        cluster's entry), carrying ``traceparent``."""
        if fault.type != "Delete":
            await self.observe(victims)

        async def one(victim: Victim) -> str:
            if victim.kind == "Cluster":
                return await self._cluster_entry(victim.cluster, entry_id,
                                                 traceparent=traceparent)
            if fault.type == "Delete":
                return await self._hold(victim, entry_id, hold=False, traceparent=traceparent)
            client = self._members.member(victim.cluster)
            if client is None:
                return f"{victim}: the cluster is not reachable"
            return await edit_entries(client, _path(victim), _recover(entry_id, traceparent),
                                      str(victim), self._observed(victim),
                                      traceparent=traceparent)
        return await self._each(victims, one)

    async def recovered(self, fault: Fault, entry_id: str, victims: Sequence[Victim]) -> bool:
        """Whether every victim is back: entries done (then removed here), held nodes made
        again, stopped components running."""
        if fault.type != "Delete":
            await self.observe(victims)  # lists the clusters too
        else:
            await self._members.clusters()
        gate = asyncio.Semaphore(CONCURRENCY)

        async def back(victim: Victim) -> bool:
            async with gate:
                return await self._back(fault, entry_id, victim)
        return all(await asyncio.gather(*(back(v) for v in victims)))

    async def _back(self, fault: Fault, entry_id: str, victim: Victim) -> bool:
        try:
            if self._members.cluster(victim.cluster) is None:
                return True  # the FakeCluster is gone, and all of it with it
            if victim.kind == "Cluster":
                return await self._components_back(victim.cluster, fault, entry_id)
            client = self._members.member(victim.cluster)
            if client is None:
                return False
            if fault.type == "Delete":
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
            where = recovery(entries, entry_id)
            if where == "again":  # its turn to recover was lost (a restart, an error)
                await edit_entries(client, _path(victim), _recover(entry_id, ""), str(victim),
                                   obj)
                return False
            if where == "waiting":
                return False
            if where == "gone":
                return True
            return not await edit_entries(client, _path(victim), _remove(entry_id),
                                          str(victim), obj)
        except K8sError as error:
            logger.info("plan %s: %s not confirmed recovered yet: %s", self.plan, victim, error)
            return False

    async def _served(self, victim: Victim) -> bool:
        """Whether a pool of the victim's cluster still has the deleted node's name (so its
        engine makes it again)."""
        found = await self.host.get(POOLS.format(namespace=self.namespace))
        for pool in found.get("items") or ():
            prefix = f"{pool['metadata']['name']}-"
            index = victim.name[len(prefix):]
            if pool["spec"].get("clusterRef") == victim.cluster and \
                    victim.name.startswith(prefix) and index.isdigit() and \
                    int(index) < int(pool["spec"].get("replicas", 0)):
                return True
        return False

    async def _components_back(self, cluster: str, fault: Fault, entry_id: str) -> bool:
        known = self._members.cluster(cluster)
        if known is not None and any(
                entry.id == entry_id for entry in
                read_entries(known.metadata.get("annotations"))[0]):
            # Its removal was lost (a restart, an error): remove it again.
            await self._cluster_entry(cluster, entry_id)
            return False
        component = catalogue.COMPONENTS.get(fault.type)
        if component is None:
            return True  # a slowdown or a hub-link fault: over once its entry is gone
        running = self._running(cluster, component)
        if running is None:
            return True  # not a control plane of ours
        if not running:
            return False
        if component != "kube-apiserver":
            return True
        client = self._members.member(cluster)
        if client is None:
            return False
        try:
            await client.get_text("/readyz")
        except K8sError:
            return False
        return True

    # -- Events --------------------------------------------------------------------------------

    async def events(self, victims: Sequence[Victim], kind: str, reason: str, message: str,
                     now: float) -> None:
        """An Event about each node and pod victim, in its cluster (one lost stops nothing)."""
        async def one(victim: Victim) -> str:
            if victim.kind == "Cluster":
                return ""
            client = self._members.member(victim.cluster)
            if client is None:
                return ""
            event = render_event(kind=victim.kind, name=victim.name,
                                 uid=self._uids.get(_seen(victim), ""),
                                 namespace=victim.namespace, event_type=kind, reason=reason,
                                 message=message, host=REPORTER, now=rfc3339(now))
            event["source"] = {"component": REPORTER}
            event["reportingComponent"] = REPORTER
            with contextlib.suppress(Conflict, NotFound):
                await client.create(f"/api/v1/namespaces/{event['metadata']['namespace']}"
                                    f"/events", event, decode=False)
            return ""
        await self._each(victims, one)

    async def _each(self, victims: Sequence[Victim],
                    act: Callable[[Victim], Awaitable[str]]) -> Delivered:
        """``act`` on every victim, CONCURRENCY at once: the problems it reported (for good: a
        victim gone, one that cannot take the fault), and the API errors to try again."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def guarded(victim: Victim) -> tuple[str, str]:
            async with gate:
                try:
                    return await act(victim), ""
                except K8sError as error:
                    return "", f"{victim}: {brief(error)}"
        found = await asyncio.gather(*(guarded(v) for v in victims))
        return Delivered([p for p, _ in found if p], [e for _, e in found if e])


async def edit_entries(client: Client, path: str, edit: Edit, what: str,
                       observed: dict[str, Any] | None = None, *,
                       traceparent: str = "") -> str:
    """Read the object's fault entries, ``edit`` them, write them back on the resourceVersion
    read (read again and edited anew after a conflict); "" when written or nothing changed,
    else what went wrong. ``observed``: the object as a list just showed it, tried first
    without reading it again. ``traceparent``: the span the write is made in, also set as the
    object's fakefleet.dev/traceparent annotation by the same write."""
    def change(obj: dict[str, Any]) -> dict[str, Any] | None:
        annotations = obj["metadata"].get("annotations") or {}
        entries, problem = read_entries(annotations)
        value = render_entries(edit([] if problem else entries, obj))
        if value == annotations.get(keys.FAULTS):
            return None
        return {"metadata": {"resourceVersion": obj["metadata"]["resourceVersion"],
                             "annotations": _with_trace({keys.FAULTS: value}, traceparent)}}
    try:
        obj = observed if observed is not None else await client.get(path)
        await patch_until_current(client, path, obj, change, _as_read,
                                  attempts=CONFLICT_RETRIES, decode=False)
    except NotFound:
        return f"{what}: not found"
    except Conflict:
        return f"{what}: changed by others {CONFLICT_RETRIES} times in a row; not written"
    return ""


def _seen(victim: Victim) -> Seen:
    return (victim.cluster, victim.kind, victim.namespace, victim.name)


def _path(victim: Victim) -> str:
    if victim.kind == "Pod":
        return f"/api/v1/namespaces/{victim.namespace}/pods/{victim.name}"
    return f"/api/v1/nodes/{victim.name}"


def _as_read(obj: Any) -> Any:
    """An object read again after a conflict is taken as it is (the edit is computed anew)."""
    return obj


def _traced(entry: FaultEntry, traceparent: str) -> FaultEntry:
    """The entry carrying the trace context of the span that writes it (none: untraced)."""
    return entry.model_copy(update={"traceparent": traceparent or None})


def _with_trace(annotations: dict[str, str | None], traceparent: str) -> dict[str, str | None]:
    """The annotations to patch, with the object's traceparent when the write is traced."""
    return {**annotations, keys.TRACEPARENT: traceparent} if traceparent else annotations


def _recover(entry_id: str, traceparent: str) -> Edit:
    """An edit that turns entry ``entry_id`` to its recovery stages, traced by ``traceparent``
    (none: it keeps the one it has)."""
    return lambda entries, _: recover_entry(entries, entry_id, traceparent)


def _remove(entry_id: str) -> Edit:
    return lambda entries, _: remove_entry(entries, entry_id)
