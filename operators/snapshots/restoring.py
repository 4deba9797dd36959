"""Restoring FakeClusters from a snapshot, through etcd, into the running ``fakefleet up``.

Per cluster, in this order (docs/snapshots.md says why):

1. **Hold.** The FakeCluster (created from the snapshot if it is gone) gets the restore's hold
   with nothing to run (:mod:`operators.api.restores`); the operator stops the member's
   add-ons, engine, controller-manager, scheduler and API server, and says so.
2. **Host objects.** The FakeCluster's spec, its FakeNodePools and its FaultPlans become the
   snapshot's (pools made since are deleted).
3. **etcd.** The member's prefix is replaced whole: every object comes back with its name, UID
   and content as saved.
4. **Times.** With the API server alone running, every time something waits on (pods' and
   nodes' status, Leases, the FaultPlans' status) moves by the time since the save.
5. **Leases.** The engine runs too and renews every Lease before the controller-manager
   starts, so its node-lifecycle controller never sees an old one.
6. **Release.** The hold goes; the operator starts the rest, and the cluster is Ready again.

A failure leaves the cluster held, stopped, and says which step it reached: running the same
restore again finishes it (every step can be done twice).

A fleet snapshot's hub state goes back once every cluster is Ready, so that its time resumes
with the fleet's: :func:`hub_import` is what the hub takes in at its next start
(``federation.hub.importing``), the command line has it restarted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from operators.api.base import API_VERSION
from operators.api.restores import RestoreHold, Runnable, held, read_hold
from operators.controlplane.etcd import EtcdEndpoint, replace_prefix
from operators.controlplane.state import StateDir
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import Conflict, K8sError, NotFound
from operators.k8s.times import parse
from operators.reconciling.clusters import cluster_key
from operators.snapshots.encoding import ClusterSnapshot, Snapshot, SnapshotError
from operators.snapshots.saving import member_prefix
from operators.snapshots.shifting import shift
from primitives import keys
from primitives.clocks import Clock
from primitives.files import private_directory, write_private
from primitives.names import member_name

logger = logging.getLogger(__name__)

GROUP_PATH = f"/apis/{API_VERSION}/namespaces/{{namespace}}"
#: How long the operator has to carry out each hold (stopping a member takes seconds).
HOLD_TIMEOUT = 120.0
#: How long the engine has to renew every Lease before the controller-manager starts anyway;
#: well inside its node-monitor grace period, which counts from its own start.
LEASES_TIMEOUT = 60.0
#: Patches of restored times in flight at once.
PATCHES = 32
#: What the restore drops from the objects it creates in the host: the server sets them.
SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields",
                 "deletionTimestamp", "deletionGracePeriodSeconds", "finalizers")


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a cluster's restore did."""

    member: str
    keys: int
    shifted_by: int
    objects_shifted: int
    seconds: float
    notes: tuple[str, ...] = ()


async def restore(snapshot: Snapshot, cluster: ClusterSnapshot, *, source: str, host: Client,
                  etcd: EtcdEndpoint, state: StateDir, clock: Clock,
                  progress: Callable[[str], None] = lambda _: None,
                  timeout: float = 300.0) -> Restored:
    """Restore ``cluster`` of ``snapshot`` (read from ``source``); SnapshotError says how far
    it got."""
    started = time.monotonic()
    member = cluster.member
    key = cluster_key(cluster.namespace, cluster.name)
    hold_id = f"{clock.now():.0f}"
    step = "hold"
    notes: list[str] = []
    try:
        if cluster.pki:
            notes += _write_pki(state, key, cluster.pki)
        progress(f"{member}: stopping its add-ons, engine and control plane")
        await _hold(host, cluster, RestoreHold(hold_id), create=True)
        step = "etcd"
        progress(f"{member}: replacing its etcd prefix ({len(cluster.keys)} keys)")
        await replace_prefix(etcd, member_prefix(cluster.namespace, cluster.name),
                             cluster.keys)
        step = "times"
        progress(f"{member}: starting its API server; shifting times, restoring its pools "
                 f"and plans")
        await _hold(host, cluster, RestoreHold(hold_id, ("kube-apiserver",)))
        seconds = round(clock.now() - snapshot.saved_at)
        async with Client.connect(load_kubeconfig_file(state.kubeconfig(key)),
                                  connections=16) as client:
            await _answering(client, timeout)
            shifted = await _shift_member(client, seconds)
            shifted += await _restore_host(host, cluster, seconds)
            step = "leases"
            progress(f"{member}: starting its engine, waiting for every Lease to be renewed")
            engine_from = clock.now()
            await _hold(host, cluster, RestoreHold(hold_id, ("kube-apiserver", "engine")))
            stale = await _leases_renewed(client, engine_from, clock)
            if stale:
                notes.append(f"{stale} Leases were not renewed within {LEASES_TIMEOUT:.0f}s "
                             f"of the engine's start: see the engine's log")
        step = "release"
        progress(f"{member}: starting its scheduler, controller-manager and add-ons")
        await _release(host, cluster, timeout)
    except (K8sError, SnapshotError, OSError) as error:
        where = {"hold": "its etcd prefix is untouched",
                 "etcd": "its etcd prefix may be partly written",
                 "times": "its etcd prefix is restored; its times, pools and plans may be "
                          "partly restored",
                 "leases": "its etcd prefix and times are restored",
                 "release": "it is restored; the operator has yet to start it"}[step]
        raise SnapshotError(
            f"restoring {member} from {source} failed at the {step} step ({error}); "
            f"{where}. The cluster stays held stopped (annotation {keys.RESTORE}): run the "
            f"same restore again to finish it, or remove the annotation to start the cluster "
            f"as it is") from error
    return Restored(member, len(cluster.keys), seconds, shifted,
                    time.monotonic() - started, tuple(notes))


def hub_import(snapshot: Snapshot, *, host: str) -> bytes:
    """What the hub takes in at its next start: the saved state, when it was saved (its times
    move by the time since), and the members restored here, which this ``host`` owns now (it
    registers them again; the saved host may be another machine)."""
    return json.dumps({"state": snapshot.hub, "savedAt": snapshot.saved_at, "host": host,
                       "members": [member_name(c.namespace, c.name)
                                   for c in snapshot.clusters]}).encode()


def _path(cluster: ClusterSnapshot, resource: str, name: str = "") -> str:
    base = f"{GROUP_PATH.format(namespace=cluster.namespace)}/{resource}"
    return f"{base}/{name}" if name else base


async def _hold(host: Client, cluster: ClusterSnapshot, hold: RestoreHold, *,
                create: bool = False) -> None:
    """Put ``hold`` on the FakeCluster and wait until the operator carried it out."""
    path = _path(cluster, "fakeclusters", cluster.name)
    patch = {"metadata": {"annotations": {keys.RESTORE: hold.render()}}}
    try:
        await host.patch(path, patch)
    except NotFound:
        if not create:
            raise
        with contextlib.suppress(Conflict):  # a fresh host may lack the namespace
            await host.create("/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": cluster.namespace}})
        await host.create(_path(cluster, "fakeclusters"),
                          _created(cluster.fake_cluster, patch["metadata"]["annotations"]))
    if create:  # its spec as saved, while nothing of it runs
        await _replace_spec(host, path, cluster.fake_cluster)
    await _wait(host, path, lambda body: held(_annotations(body)) == hold.token,
                HOLD_TIMEOUT, f"the operator to hold FakeCluster {cluster.member} "
                              f"({_running(hold.run)})")


def _running(run: Iterable[Runnable]) -> str:
    names = list(run)
    return f"only {', '.join(names)} running" if names else "everything stopped"


async def _release(host: Client, cluster: ClusterSnapshot, timeout: float) -> None:
    path = _path(cluster, "fakeclusters", cluster.name)
    await host.patch(path, {"metadata": {"annotations": {keys.RESTORE: None}}})
    await _wait(host, path, lambda body: held(_annotations(body)) is None
                and read_hold(_annotations(body)) is None
                and (body.get("status") or {}).get("phase") == "Ready",
                timeout, f"FakeCluster {cluster.member} to be Ready again")


async def _wait(host: Client, path: str, done: Callable[[dict[str, Any]], bool],
                timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done(await host.get(path)):
        if time.monotonic() > deadline:
            raise SnapshotError(f"waited {timeout:.0f}s for {what}: is the operator running? "
                                f"'fakefleet status' shows it")
        await asyncio.sleep(0.2)


def _annotations(body: dict[str, Any]) -> dict[str, str]:
    return dict((body.get("metadata") or {}).get("annotations") or {})


def _created(saved: dict[str, Any], annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    """A saved host object as a create takes it: the server's fields dropped."""
    metadata = {key: value for key, value in saved["metadata"].items()
                if key not in SERVER_FIELDS}
    kept = {key: value for key, value in (metadata.get("annotations") or {}).items()
            if not key.startswith(f"{keys.GROUP}/") and value is not None}
    metadata["annotations"] = {**kept, **(annotations or {})}
    return {"apiVersion": saved["apiVersion"], "kind": saved["kind"], "metadata": metadata,
            "spec": saved["spec"]}


async def _replace_spec(host: Client, path: str, saved: dict[str, Any]) -> None:
    current = await host.get(path)
    if current.get("spec") != saved["spec"]:
        await host.replace(path, {**current, "spec": saved["spec"]})


async def _restore_host(host: Client, cluster: ClusterSnapshot, seconds: int) -> int:
    """The pools and plans as saved (their status times shifted); pools of the cluster that
    the snapshot does not have are deleted. How many statuses were written."""
    pools = _path(cluster, "fakenodepools")
    saved_pools = {pool["metadata"]["name"]: pool for pool in cluster.pools}
    for pool in (await host.get(pools)).get("items") or []:
        name = pool["metadata"]["name"]
        if pool["spec"].get("clusterRef") == cluster.name and name not in saved_pools:
            with contextlib.suppress(NotFound):
                await host.delete(f"{pools}/{name}")
    written = 0
    for resource, saved in (("fakenodepools", cluster.pools), ("faultplans", cluster.plans)):
        for body in saved:
            path = _path(cluster, resource, body["metadata"]["name"])
            try:
                await _replace_spec(host, path, body)
            except NotFound:
                await host.create(_path(cluster, resource), _created(body))
            if resource == "faultplans" and body.get("status"):
                await host.patch(f"{path}/status", {"status": shift(body["status"], seconds)})
                written += 1
    return written


async def _answering(client: Client, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.get_text("/readyz")
            return
        except K8sError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _shift_member(client: Client, seconds: int) -> int:
    """Move the times of every pod, node and node Lease by ``seconds``; how many objects."""
    writes: list[Callable[[], Awaitable[Any]]] = []
    for pod in (await client.get("/api/v1/pods")).get("items") or []:
        status = pod.get("status") or {}
        moved = shift(status, seconds)
        if moved != status:
            path = (f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/"
                    f"{pod['metadata']['name']}/status")
            writes.append(_patcher(client, path, {"status": moved}))
    for node in (await client.get("/api/v1/nodes")).get("items") or []:
        conditions = (node.get("status") or {}).get("conditions") or []
        if conditions:
            writes.append(_patcher(client, f"/api/v1/nodes/{node['metadata']['name']}/status",
                                   {"status": {"conditions": shift(conditions, seconds)}}))
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    for lease in (await client.get(leases)).get("items") or []:
        spec = lease.get("spec") or {}
        moved = shift(spec, seconds)
        if moved != spec:
            writes.append(_patcher(client, f"{leases}/{lease['metadata']['name']}",
                                   {"spec": moved}))
    slots = asyncio.Semaphore(PATCHES)

    async def bounded(write: Callable[[], Awaitable[Any]]) -> None:
        async with slots:
            with contextlib.suppress(NotFound):  # gone meanwhile (a pod's owner deleted it)
                await write()

    await asyncio.gather(*(bounded(write) for write in writes))
    return len(writes)


def _patcher(client: Client, path: str, body: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
    return lambda: client.patch(path, body, decode=False)


async def _leases_renewed(client: Client, since: float, clock: Clock) -> int:
    """Wait until the engine renewed every node Lease after ``since``; how many it had not
    when :data:`LEASES_TIMEOUT` ran out."""
    deadline = time.monotonic() + LEASES_TIMEOUT
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    while True:
        items = (await client.get(leases)).get("items") or []
        stale = sum(1 for lease in items
                    if parse((lease.get("spec") or {}).get("renewTime") or
                             "1970-01-01T00:00:00Z") < since)
        if not stale or time.monotonic() > deadline:
            return stale
        await clock.sleep(0.5)


def _write_pki(state: StateDir, key: str, pki: Iterable[tuple[str, bytes]]) -> list[str]:
    """Write the snapshot's certificates where the member has none (restored on another
    machine); where it has its own and they differ, say so: the restored objects' tokens and
    CA bundle then name the snapshot's."""
    root = state.cluster(key)
    differ = []
    for relative, data in pki:
        path = root / relative
        if path.exists():
            if path.read_bytes() != data:
                differ.append(relative)
            continue
        private_directory(path.parent)
        write_private(path, data)
    if differ:
        return [f"the member's certificates differ from the snapshot's ({len(differ)} files, "
                f"e.g. {differ[0]}): kept its own; tokens in restored Secrets may not verify"]
    return []
