"""Saving FakeClusters: everything read from the shared etcd at one revision.

A member's API objects are its etcd prefix (``/fakefleet/clusters/<namespace>.<name>/``); the
FakeCluster, its FakeNodePools and the FaultPlans of its namespace are custom resources of the
host cluster, whose prefix is in the same etcd, stored as JSON. So one read at one revision
(:func:`~operators.controlplane.etcd.read_prefixes`) gives a state that existed at one moment
across every member and the host: no object is newer than another. The engine's view (pod
start times, timers, fault entries) is in those objects too: the engine keeps nothing that
matters in memory only. Keys bound to an etcd lease (Events, the API server's own lease) are
not saved.

What the API servers compute from etcd is not read from them, so a saved value is exactly what
a restore writes back: same names, same UIDs.

The federation hub's members, runs and workloads are not in etcd: they are read from the file
the hub keeps them in, before and right *after* etcd, and the one after is saved. The hub
writes that file (whole, atomically) before it sends anything, so every command whose effect
the members' objects show at the revision is in it. When both reads are the same, it is the
state the hub had stored at the revision (:attr:`Snapshot.hub_at_revision`); else it holds
what the hub stored during the read too (a command sent, a result heard since), as a hub ahead
of its members does after any restart, which the members' Hello settles (docs/snapshots.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from operators.controlplane.components import etcd_prefix
from operators.controlplane.etcd import EtcdEndpoint, KeyValue, read_prefixes
from operators.controlplane.state import HOST_CLUSTER, StateDir
from operators.reconciling.clusters import cluster_key
from operators.snapshots.encoding import ClusterSnapshot, Snapshot, SnapshotError
from primitives import keys
from primitives.clocks import Clock

#: Where the host's custom resources of one namespace are in etcd.
HOST_RESOURCES = ("fakeclusters", "fakenodepools", "faultplans")
#: A member's Secrets, which ``--without-secrets`` leaves out.
SECRETS = b"secrets/"


def member_prefix(namespace: str, name: str) -> str:
    return etcd_prefix(cluster_key(namespace, name)) + "/"


def host_prefix(resource: str, namespace: str) -> str:
    return f"{etcd_prefix(HOST_CLUSTER)}/{keys.GROUP}/{resource}/{namespace}/"


async def save(*, etcd: EtcdEndpoint, state: StateDir, members: Sequence[tuple[str, str]],
               secrets: bool, clock: Clock, hub: Path | None = None) -> Snapshot:
    """The members (namespace, name) as they are now, read at one etcd revision, and the
    hub's state from ``hub`` (its ``state.json``) when given."""
    namespaces = sorted({namespace for namespace, _ in members})
    prefixes = [host_prefix(resource, namespace) for namespace in namespaces
                for resource in HOST_RESOURCES]
    prefixes += [member_prefix(namespace, name) for namespace, name in members]
    saved_at = clock.now()
    hub_before = _hub_state(hub) if hub is not None else None
    revision, found = await read_prefixes(etcd, prefixes)
    hub_state = _hub_state(hub) if hub is not None else None
    clusters = []
    for namespace, name in members:
        objects = {resource: _decoded(found[host_prefix(resource, namespace)])
                   for resource in HOST_RESOURCES}
        cluster = objects["fakeclusters"].get(name)
        if cluster is None:
            raise SnapshotError(f"FakeCluster {namespace}/{name} does not exist: "
                                f"'fakefleet get clusters' lists them")
        kvs = found[member_prefix(namespace, name)]
        if not kvs:
            raise SnapshotError(f"FakeCluster {namespace}/{name} has no data in etcd (an "
                                f"adopted cluster, or one not started yet): only local members "
                                f"can be saved")
        clusters.append(ClusterSnapshot(
            namespace=namespace, name=name,
            keys=tuple(kv for kv in kvs if secrets or not kv[0].startswith(SECRETS)),
            fake_cluster=cluster,
            pools=tuple(pool for pool in objects["fakenodepools"].values()
                        if pool.get("spec", {}).get("clusterRef") == name),
            plans=tuple(plan for plan in objects["faultplans"].values()
                        if name in (plan.get("spec", {}).get("clusters") or [name])),
            pki=_pki(state, cluster_key(namespace, name)) if secrets else ()))
    return Snapshot(saved_at=saved_at, revision=revision, secrets=secrets,
                    clusters=tuple(clusters), hub=hub_state,
                    hub_at_revision=hub_state is not None and hub_state == hub_before)


def _hub_state(path: Path) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise SnapshotError(f"the hub keeps no state at {path}: is a hub running ('fakefleet "
                            f"status')? Save without it: --without-hub") from None
    except (OSError, ValueError) as error:
        raise SnapshotError(f"cannot read the hub's state {path}: {error}") from error
    return found


def _decoded(kvs: list[KeyValue]) -> dict[str, dict[str, Any]]:
    """Custom resources as etcd holds them (JSON), by name."""
    found = {}
    for key, value in kvs:
        body: dict[str, Any] = json.loads(value)
        found[key.decode()] = body
    return found


def _pki(state: StateDir, key: str) -> tuple[tuple[str, bytes], ...]:
    """The member's certificates and keys: what its Secrets' tokens and its kube-root-ca.crt
    were made with, needed to restore it on another machine."""
    root = state.cluster(key)
    files: list[Path] = []
    for directory in (state.pki(key), state.front_proxy_pki(key)):
        files += sorted(path for path in directory.rglob("*") if path.is_file()
                        and not path.name.endswith(".tmp"))
    return tuple((str(path.relative_to(root)), path.read_bytes()) for path in files)
