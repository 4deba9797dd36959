"""How a FaultPlan's faults reach their victims and leave them again: every write the plan makes
into the fleet, and the Events it sends about them.

A fault travels by one of three channels (:mod:`operators.api.injections`):

- node and pod faults: a *fault set* in each member the occurrence hits
  (:mod:`operators.api.faultsets`): one ConfigMap (more only past its size) that carries the
  fault entry and names every target, whose stages the member's engine runs on each. One
  create per occurrence and cluster, however many victims: the step is visible as fast as the
  engine's own status writes go;
- a node Delete: the node's FakeNodePool (in the host) holds it deleted in its
  ``fakefleet.dev/held-nodes`` annotation, which the pool's engine obeys;
- a cluster fault: an entry on the FakeCluster (in the host), which the operator applies at
  once (``apply``: components stopped and started again), and the cluster's engine
  (APIServerSlow) or its hub link (HubPartition, HubLatency) obeys.

Delivery walks each fault through its life: a set is created in state inject (a create that
finds it there already, written before a restart, is that write), turned to its recovery
(one conditional PATCH per set), and deleted once the engine marked it done; a hold is
released; a FakeCluster's entry is removed when its fault ends (nobody marks it done: it is
recovered once it is gone and what it stopped runs again). Every change of an object others
write too is conditional on the resourceVersion it was computed from
(:mod:`operators.k8s.patching`, read again after a conflict), and carries the writing span's
traceparent. Victims are listed once per cluster and kind (:meth:`Delivery.observe`) for what
their entries depend on (a node's GPUs, a pod's uid and restart count); nothing is read or
written per victim.

Events: one per occurrence and cluster for a fault set, about the set (``kubectl get events -n
fakefleet-system``), sent after the set is written: an Event per victim would be as many
writes as the fault itself, competing with the engine's. Deleted nodes, few and slow, still
get one each.

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

from operators.api import faultsets
from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.faultplans import Fault
from operators.api.faultsets import FaultSet, SetError
from operators.api.injections import (
    FaultEntry,
    hold_node,
    inject_entry,
    read_entries,
    read_held,
    release_node,
    remove_entry,
    render_entries,
    render_held,
)
from operators.faults import catalogue
from operators.faults.targets import Victim
from operators.k8s import owning
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, K8sError, NotFound, NotOwned, brief
from operators.k8s.events import render_event
from operators.k8s.patching import patch_until_current
from operators.k8s.times import rfc3339
from primitives import keys

logger = logging.getLogger(__name__)

BASE = f"/apis/{API_VERSION}/namespaces/{{namespace}}"
CLUSTERS = BASE + "/fakeclusters"
POOLS = BASE + "/fakenodepools"
#: Writes of one injection in flight at once, per member cluster (holds, cluster entries,
#: Events about deleted nodes).
CONCURRENCY = 64
CONFLICT_RETRIES = 8
#: Who the Events about victims say they come from.
REPORTER = "fakefleet-faultplan"
#: Victims an Event about a fault set names before it says how many more there are.
NAMED = 5
#: The member namespace of the fault sets is fakefleet's.
NAMESPACE_OWNER = owning.Owner(faultsets.NAMESPACE_WRITER)

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

    @staticmethod
    def of(parts: Sequence[Delivered]) -> Delivered:
        return Delivered([p for part in parts for p in part.problems],
                         [f for part in parts for f in part.failed])


#: How a listed object is found again: (cluster, kind, namespace, name).
Seen = tuple[str, str, str, str]


def carried_by_set(fault: Fault, victim: Victim) -> bool:
    """Whether the fault reaches ``victim`` through a fault set (every node and pod fault but a
    node's Delete, which its pool carries)."""
    return victim.kind == "Pod" or (victim.kind == "Node" and fault.type != "Delete")


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
        #: What the plan's fault sets in the members carry as theirs.
        self._owner = owning.Owner(f"FaultPlan/{plan}")
        #: Victims as the last list showed them, so that their entries can be made without
        #: reading each object; and their uids (for Events about them).
        self._seen: dict[Seen, dict[str, Any]] = {}
        self._uids: dict[Seen, str] = {}
        #: Members whose namespace of fault sets is known to be there and fakefleet's.
        self._namespaces: set[str] = set()
        #: (cluster, entry id) → the first set of the occurrence there, name and uid, as last
        #: written or listed (what Events are about).
        self._sets: dict[tuple[str, str], tuple[str, str]] = {}

    # -- looking -------------------------------------------------------------------------------

    def remember(self, cluster: str, kind: str, item: dict[str, Any]) -> None:
        """Keep a listed node or pod, to make its entry without reading it again."""
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

    # -- inject --------------------------------------------------------------------------------

    async def inject(self, fault: Fault, entry_id: str, victims: Sequence[Victim],
                     traceparent: str) -> Delivered:
        """Write entry ``entry_id`` of ``fault`` for every victim (idempotent by id), carrying
        ``traceparent``: a fault set per cluster, a hold, a FakeCluster's entry."""
        alone = [v for v in victims if not carried_by_set(fault, v)]
        parts = [await self._each(alone, lambda v: self._inject_one(fault, entry_id, v,
                                                                   traceparent))]
        for cluster, hit in _by_cluster(v for v in victims if carried_by_set(fault, v)):
            parts.append(await self._write_sets(cluster, fault, entry_id, hit, traceparent))
        return Delivered.of(parts)

    async def _inject_one(self, fault: Fault, entry_id: str, victim: Victim,
                          traceparent: str) -> str:
        if victim.kind == "Cluster":
            return await self._cluster_entry(victim.cluster, entry_id, add=fault,
                                             traceparent=traceparent)
        return await self._hold(victim, entry_id, hold=True, traceparent=traceparent)

    async def _write_sets(self, cluster: str, fault: Fault, entry_id: str,
                          victims: Sequence[Victim], traceparent: str) -> Delivered:
        """The occurrence's fault set in ``cluster``: each victim with its entry (in chunks
        past a set's size), created once; a set found there already is the one written
        before a restart."""
        client = self._members.member(cluster)
        if client is None:
            return Delivered([f"{v}: the cluster is not reachable" for v in victims], [])
        kind: faultsets.Kind = "Pod" if victims[0].kind == "Pod" else "Node"
        problems: list[str] = []
        members: list[tuple[str, FaultEntry]] = []
        hit: list[Victim] = []
        try:
            waiting = await self._waiting_exits(client, entry_id) if kind == "Pod" else {}
        except K8sError as error:
            return Delivered([], [f"{v}: {brief(error)}" for v in victims])
        for victim in victims:
            obj = self._seen.pop(_seen(victim), None)  # a later write lists them again
            if obj is None:
                problems.append(f"{victim}: not found")
                continue
            hit.append(victim)
            members.append(_member(kind, fault, entry_id, obj, waiting))
        failed: list[str] = []
        try:
            await self._namespace(cluster, client)
        except NotOwned as error:
            return Delivered([*problems, *(f"{v}: {error}" for v in hit)], [])
        except K8sError as error:
            return Delivered(problems, [f"{v}: {brief(error)}" for v in hit])
        for chunk, positions in enumerate(faultsets.chunks([target for target, _ in members])):
            body = faultsets.render(entry_id, kind, chunk, [members[i] for i in positions],
                                    traceparent=traceparent)
            try:
                uid = await self._create_set(client, body, entry_id, kind)
            except NotOwned as error:
                problems += [f"{hit[i]}: {error}" for i in positions]
                continue
            except K8sError as error:
                failed += [f"{hit[i]}: {brief(error)}" for i in positions]
                continue
            if chunk == 0:
                self._sets[(cluster, entry_id)] = (body["metadata"]["name"], uid)
        return Delivered(problems, failed)

    async def _waiting_exits(self, client: Client,
                             entry_id: str) -> dict[str, list[FaultEntry]]:
        """By pod uid, the entries of the member's other pod sets still in state inject: a
        one-shot exit written now comes after those still waiting to fire
        (:func:`~operators.faults.catalogue.one_shot_restarts`)."""
        waiting: dict[str, list[FaultEntry]] = {}
        for found in await _list_sets(client, keys.FAULT_SET):
            if found.kind == "Pod" and found.state == "inject" and found.id != entry_id:
                for group in found.groups:
                    for target in group.targets:
                        waiting.setdefault(faultsets.pod_uid(target), []).append(group.entry)
        return waiting

    async def _namespace(self, cluster: str, client: Client) -> None:
        if cluster not in self._namespaces:
            await owning.ensure_namespace(client, faultsets.NAMESPACE, owner=NAMESPACE_OWNER)
            self._namespaces.add(cluster)

    async def _create_set(self, client: Client, body: dict[str, Any], entry_id: str,
                          kind: faultsets.Kind) -> str:
        """Create one set; its uid. One there already is this occurrence's (written before a
        restart) when it is the plan's and names the same entry; else NotOwned."""
        try:
            created = await client.create(faultsets.CONFIGMAPS, self._owner.mark(body))
            return str(created["metadata"].get("uid", ""))
        except Conflict as error:
            if not error.already_exists:
                raise
        current = await client.get(f"{faultsets.CONFIGMAPS}/{body['metadata']['name']}")
        try:
            same = faultsets.same_occurrence(faultsets.read(current), entry_id, kind)
        except SetError:
            same = False
        if not (same and self._owner.owns(current)):
            raise owning.refusal({**current, "kind": "ConfigMap"}, self._owner)
        return str(current["metadata"].get("uid", ""))

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
        """Turn the occurrence's fault sets to their recovery (one conditional PATCH per set),
        release a Delete's holds, remove a cluster's entry; carrying ``traceparent``."""
        await self._members.clusters()
        alone = [v for v in victims if not carried_by_set(fault, v)]

        async def one(victim: Victim) -> str:
            if victim.kind == "Cluster":
                return await self._cluster_entry(victim.cluster, entry_id,
                                                 traceparent=traceparent)
            return await self._hold(victim, entry_id, hold=False, traceparent=traceparent)
        parts = [await self._each(alone, one)]
        for cluster, hit in _by_cluster(v for v in victims if carried_by_set(fault, v)):
            client = self._members.member(cluster)
            if client is None:
                parts.append(Delivered([f"{v}: the cluster is not reachable" for v in hit], []))
                continue
            try:
                await self._turn(client, cluster, entry_id, traceparent)
            except K8sError as error:
                parts.append(Delivered([], [f"{v}: {brief(error)}" for v in hit]))
        return Delivered.of(parts)

    async def _turn(self, client: Client, cluster: str, entry_id: str,
                    traceparent: str) -> list[FaultSet]:
        """Turn every set of the occurrence in ``cluster`` that is still inject to its recovery;
        the sets as they are now."""
        found = await self._occurrence(client, cluster, entry_id)
        turned = []
        for each in found:
            path = f"{faultsets.CONFIGMAPS}/{each.name}"
            try:
                written, seen = await patch_until_current(
                    client, path, each, lambda s: faultsets.recover_patch(s, traceparent),
                    _readable, attempts=CONFLICT_RETRIES)
            except NotFound:
                continue  # deleted meanwhile: nothing of it left to undo
            turned.append(faultsets.read(written) if written is not None else seen)
        return turned

    async def _occurrence(self, client: Client, cluster: str, entry_id: str) -> list[FaultSet]:
        """The occurrence's sets in ``cluster`` (its chunks), remembering the first."""
        found = await _list_sets(client, faultsets.selector(entry_id))
        mine = [each for each in found if each.id == entry_id]
        if mine:
            first = min(mine, key=lambda each: each.name)
            self._sets[(cluster, entry_id)] = (first.name, first.uid)
        return mine

    async def recovered(self, fault: Fault, entry_id: str, victims: Sequence[Victim]) -> bool:
        """Whether every victim is back: fault sets done (then deleted here), held nodes made
        again, stopped components running."""
        await self._members.clusters()
        gate = asyncio.Semaphore(CONCURRENCY)

        async def back(victim: Victim) -> bool:
            async with gate:
                return await self._back(fault, entry_id, victim)
        alone = [v for v in victims if not carried_by_set(fault, v)]
        results = await asyncio.gather(*(back(v) for v in alone))
        for cluster, _ in _by_cluster(v for v in victims if carried_by_set(fault, v)):
            results.append(await self._sets_back(cluster, entry_id))
        return all(results)

    async def _sets_back(self, cluster: str, entry_id: str) -> bool:
        """Whether the occurrence's sets in ``cluster`` are done (then deleted), or gone."""
        if self._members.cluster(cluster) is None:
            return True  # the FakeCluster is gone, and all of it with it
        client = self._members.member(cluster)
        if client is None:
            return False
        try:
            found = await self._occurrence(client, cluster, entry_id)
            where = faultsets.recovery(found)
            if where == "again":  # its turn to recover was lost (a restart, an error)
                await self._turn(client, cluster, entry_id, "")
                return False
            if where == "waiting":
                return False
            for each in found:
                await owning.delete(client, f"{faultsets.CONFIGMAPS}/{each.name}",
                                    owner=self._owner)
        except K8sError as error:
            logger.info("plan %s: %s in %s not confirmed recovered yet: %s", self.plan,
                        entry_id, cluster, error)
            return False
        return True

    async def _back(self, fault: Fault, entry_id: str, victim: Victim) -> bool:
        """Whether a victim carried by no set is back: a deleted node made again and Ready,
        a stopped component running."""
        try:
            if self._members.cluster(victim.cluster) is None:
                return True  # the FakeCluster is gone, and all of it with it
            if victim.kind == "Cluster":
                return await self._components_back(victim.cluster, fault, entry_id)
            client = self._members.member(victim.cluster)
            if client is None:
                return False
            try:
                node = await client.get(f"/api/v1/nodes/{victim.name}")
            except NotFound:
                return not await self._served(victim)
            return any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (node.get("status") or {}).get("conditions") or ())
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

    async def events(self, fault: Fault, entry_id: str, victims: Sequence[Victim], kind: str,
                     reason: str, message: str, now: float) -> None:
        """Events about what the plan did (one lost stops nothing): one per cluster about the
        occurrence's fault set there, naming the first victims; one about each deleted node."""
        async def one(victim: Victim) -> str:
            client = self._members.member(victim.cluster)
            if client is not None:
                await self._event(client, render_event(
                    kind=victim.kind, name=victim.name, uid=self._uids.get(_seen(victim), ""),
                    namespace=victim.namespace, event_type=kind, reason=reason,
                    message=message, host=REPORTER, now=rfc3339(now)))
            return ""
        await self._each([v for v in victims if v.kind == "Node" and fault.type == "Delete"],
                         one)
        for cluster, hit in _by_cluster(v for v in victims if carried_by_set(fault, v)):
            client = self._members.member(cluster)
            if client is None:
                continue
            name, uid = self._sets.get((cluster, entry_id), (faultsets.set_name(entry_id, 0),
                                                             ""))
            said = f"{message} on {len(hit)} {hit[0].kind.lower()}(s): {_named(hit)}"
            with contextlib.suppress(K8sError):
                await self._event(client, render_event(
                    kind="ConfigMap", name=name, uid=uid, namespace=faultsets.NAMESPACE,
                    event_type=kind, reason=reason, message=said, host=REPORTER,
                    now=rfc3339(now)))

    @staticmethod
    async def _event(client: Client, event: dict[str, Any]) -> None:
        event["source"] = {"component": REPORTER}
        event["reportingComponent"] = REPORTER
        with contextlib.suppress(Conflict, NotFound):
            await client.create(f"/api/v1/namespaces/{event['metadata']['namespace']}"
                                f"/events", event, decode=False)

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


async def edit_entries(client: Client, path: str, edit: Edit, what: str, *,
                       traceparent: str = "") -> str:
    """Read the object's fault entries, ``edit`` them, write them back on the resourceVersion
    read (read again and edited anew after a conflict); "" when written or nothing changed,
    else what went wrong. ``traceparent``: the span the write is made in, also set as the
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
        await patch_until_current(client, path, await client.get(path), change, _as_read,
                                  attempts=CONFLICT_RETRIES, decode=False)
    except NotFound:
        return f"{what}: not found"
    except Conflict:
        return f"{what}: changed by others {CONFLICT_RETRIES} times in a row; not written"
    return ""


async def _list_sets(client: Client, selector: str) -> list[FaultSet]:
    """The member's fault sets the label selector picks; a ConfigMap that holds none is
    logged and left out."""
    found = await client.get(faultsets.CONFIGMAPS, {"labelSelector": selector})
    sets = []
    for item in found.get("items") or ():
        try:
            sets.append(faultsets.read(item))
        except SetError as error:
            logger.warning("%s", error)
    return sets


def _readable(obj: Any) -> FaultSet | None:
    """A set read again after a conflict; None (as if made again) if it holds none now."""
    try:
        return faultsets.read(obj)
    except SetError:
        return None


def _member(kind: faultsets.Kind, fault: Fault, entry_id: str, obj: Mapping[str, Any],
            waiting: Mapping[str, list[FaultEntry]]) -> tuple[str, FaultEntry]:
    """A victim as its fault set names it, and the entry it gets (from the object as listed:
    a node's GPUs, a pod's restart count and the exits still waiting on it)."""
    meta = obj["metadata"]
    if kind == "Pod":
        uid = str(meta.get("uid", ""))
        restarts = max((c.get("restartCount", 0) for c in (obj.get("status") or {})
                        .get("containerStatuses") or ()), default=0)
        return faultsets.pod_target(meta.get("namespace", ""), meta["name"], uid), \
            catalogue.pod_entry(entry_id, fault, restarts=catalogue.one_shot_restarts(
                waiting.get(uid, []), restarts))
    gpus, extended = catalogue.node_gpus(obj)
    return str(meta["name"]), catalogue.node_entry(entry_id, fault, gpus=gpus,
                                                   extended=extended)


def _by_cluster(victims: Any) -> list[tuple[str, list[Victim]]]:
    """Victims by cluster, in the order their clusters first come."""
    grouped: dict[str, list[Victim]] = {}
    for victim in victims:
        grouped.setdefault(victim.cluster, []).append(victim)
    return list(grouped.items())


def _named(victims: Sequence[Victim]) -> str:
    names = [f"{v.namespace}/{v.name}" if v.namespace else v.name for v in victims[:NAMED]]
    more = f" (and {len(victims) - NAMED} more)" if len(victims) > NAMED else ""
    return ", ".join(names) + more


def _seen(victim: Victim) -> Seen:
    return (victim.cluster, victim.kind, victim.namespace, victim.name)


def _as_read(obj: Any) -> Any:
    """An object read again after a conflict is taken as it is (the edit is computed anew)."""
    return obj


def _traced(entry: FaultEntry, traceparent: str) -> FaultEntry:
    """The entry carrying the trace context of the span that writes it (none: untraced)."""
    return entry.model_copy(update={"traceparent": traceparent or None})


def _with_trace(annotations: dict[str, str | None], traceparent: str) -> dict[str, str | None]:
    """The annotations to patch, with the object's traceparent when the write is traced."""
    return {**annotations, keys.TRACEPARENT: traceparent} if traceparent else annotations
