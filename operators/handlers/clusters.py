"""kopf glue for FakeCluster: observe, call the pure planner, apply its actions, report status.

Runs on create, update and resume (so an operator restart adopts or restarts what exists, with
the same ports and data) and on a timer (to heal and to refresh node counts). Deletion goes
through kopf's finalizer: the engine stops, the control plane stops and its etcd data is purged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import Any

import kopf

from operators.api.clusters import KUBECONFIG_KEY, FakeCluster, FakeClusterStatus
from operators.controlplane.components import Profile
from operators.controlplane.errors import BinaryError, ControlPlaneError, PortInUseError
from operators.controlplane.substrate import ClusterOptions
from operators.engine.running import ClusterEngine
from operators.handlers.runtime import Runtime, wait_until_none
from operators.k8s.applying import apply
from operators.k8s.client import Client
from operators.k8s.config import ClusterAccess, load_kubeconfig
from operators.k8s.errors import K8sError, NotFound
from operators.k8s.times import rfc3339
from operators.reconciling import clusters as planning

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT = 120.0
CLUSTERS = "/apis/fakefleet.dev/v1alpha1/namespaces/{namespace}/fakeclusters/{name}"
SECRETS = "/api/v1/namespaces/{namespace}/secrets"


async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Create/update/resume handler and timer of FakeCluster."""
    runtime: Runtime = memo.runtime
    cluster = FakeCluster.model_validate(dict(body))
    namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
    key = planning.cluster_key(namespace, name)
    async with runtime.lock(key):
        observed = await observe(runtime, cluster, key)
        error, stalled, delay = "", False, 5.0
        actions = planning.plan(cluster, observed)
        reported = cluster.status
        if actions:  # say what is missing before mending it: a restart shows as not Ready
            reported = await report(runtime, cluster, observed, reported)
        for action in actions:
            try:
                await execute(runtime, cluster, key, action)
            except (ControlPlaneError, K8sError) as failure:
                error = str(failure)
                # A missing or unbuildable binary does not fix itself: say so and stop trying.
                stalled = isinstance(failure, BinaryError)
                # A port still held by a stopping apiserver of an earlier run frees quickly.
                delay = 2.0 if isinstance(failure, PortInUseError) else 5.0
                logger.warning("cluster %s: %s failed: %s", key, type(action).__name__, error)
                break
        if actions:  # something changed: look again (the timer's no-op ticks do not)
            observed = await observe(runtime, cluster, key, error=error, stalled=stalled)
        await report(runtime, cluster, observed, reported)
    if error and not stalled:
        raise kopf.TemporaryError(error, delay=delay)


async def delete(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer: stop the engine and the control plane, purge the member's etcd data."""
    runtime: Runtime = memo.runtime
    cluster = FakeCluster.model_validate(dict(body))
    key = planning.cluster_key(cluster.metadata["namespace"], cluster.metadata["name"])
    async with runtime.lock(key):
        for action in planning.plan(cluster, planning.Observed(), deleting=True):
            await execute(runtime, cluster, key, action)
    runtime.locks.pop(key, None)


async def observe(runtime: Runtime, cluster: FakeCluster, key: str, *, error: str = "",
                  stalled: bool = False) -> planning.Observed:
    local = runtime.substrate.clusters.get(key)
    if cluster.spec.controlPlane.backend == "local":
        running = local is not None and local.apiserver.running
        endpoint = local.endpoint if local else ""
    else:
        access = runtime.external.get(key)
        running = access is not None
        endpoint = access.server if access else ""
    engine = runtime.engines.get(key)
    totals = engine.totals() if engine and engine.synced.is_set() else None
    previous = cluster.status
    return planning.Observed(
        control_plane_running=running,
        secret_current=local is not None and await _secret_current(runtime, cluster, local),
        engine_running=engine is not None,
        endpoint=endpoint,
        version=engine.kubelet_version if engine else "",
        # Until a (re)started engine has listed its nodes, the last report stands.
        nodes=totals.replicas if totals else previous.nodes if previous else 0,
        ready_nodes=totals.ready if totals else previous.readyNodes if previous else 0,
        error=error,
        stalled=stalled,
    )


async def execute(runtime: Runtime, cluster: FakeCluster, key: str,
                  action: planning.Action) -> None:
    spec = cluster.spec.controlPlane
    namespace = cluster.metadata["namespace"]
    if isinstance(action, planning.StartControlPlane):
        binaries = await asyncio.to_thread(runtime.resolve_binaries,
                                           cluster.spec.kubernetesVersion)
        await runtime.substrate.add_cluster(key, ClusterOptions(
            scheduler=spec.scheduler, controller_manager=spec.controllerManager,
            profile=Profile(spec.profile), binaries=binaries,
        ))
    elif isinstance(action, planning.ConnectExternal):
        secret = await runtime.host.get(f"{SECRETS.format(namespace=namespace)}/{action.secret}")
        data = (secret.get("data") or {}).get(action.key)
        if data is None:
            raise K8sError(f"Secret {namespace}/{action.secret} has no key {action.key!r}: "
                           f"put the kubeconfig of the cluster to adopt there")
        runtime.external[key] = load_kubeconfig(base64.b64decode(data).decode())
    elif isinstance(action, planning.WriteKubeconfigSecret):
        local = runtime.substrate.clusters[key]
        await apply(runtime.host, _kubeconfig_secret(cluster, action.name,
                                                     local.kubeconfig_path.read_text()),
                    "secrets")
    elif isinstance(action, planning.StartEngine):
        access = _member_access(runtime, cluster, key)
        runtime.engines.start(key, lambda: ClusterEngine(key, Client(access, connections=32)))
    elif isinstance(action, planning.DrainNodes):
        await _drain(runtime, key)
    elif isinstance(action, planning.StopEngine):
        await runtime.engines.stop(key)
    elif isinstance(action, planning.RemoveControlPlane):
        await runtime.substrate.remove_cluster(key, purge=True)
        runtime.external.pop(key, None)


async def report(runtime: Runtime, cluster: FakeCluster, observed: planning.Observed,
                 previous: FakeClusterStatus | None) -> FakeClusterStatus:
    """Patch the status subresource unless it already says this; return what it now says."""
    status = planning.status(cluster, observed, now=rfc3339(), previous=previous)
    if status == previous:
        return status
    path = CLUSTERS.format(namespace=cluster.metadata["namespace"],
                           name=cluster.metadata["name"])
    with contextlib.suppress(NotFound):  # deleted meanwhile
        await runtime.host.patch(f"{path}/status", {"status": status.model_dump(mode="json")})
    return status


async def _drain(runtime: Runtime, key: str) -> None:
    engine = runtime.engines.get(key)
    if engine is None:
        return  # never ran here: it made no nodes
    engine.drain()
    try:
        # Its first listing shows what there is to delete; an adopted cluster that never
        # answered has nothing of ours we could reach, and must not block the deletion.
        await asyncio.wait_for(engine.synced.wait(), DRAIN_TIMEOUT)
    except TimeoutError:
        logger.warning("cluster %s: unreachable, its fake nodes (if any) stay there", key)
        return
    left = await wait_until_none(lambda: engine.totals().replicas, DRAIN_TIMEOUT)
    if left:
        raise kopf.TemporaryError(f"{left} fake nodes still being deleted from the adopted "
                                  f"cluster", delay=5)


def _member_access(runtime: Runtime, cluster: FakeCluster, key: str) -> ClusterAccess:
    if cluster.spec.controlPlane.backend == "external":
        return runtime.external[key]
    return load_kubeconfig(runtime.substrate.clusters[key].kubeconfig_path.read_text())


async def _secret_current(runtime: Runtime, cluster: FakeCluster, local: Any) -> bool:
    name = planning.kubeconfig_secret_name(cluster.metadata["name"])
    try:
        secret = await runtime.host.get(
            f"{SECRETS.format(namespace=cluster.metadata['namespace'])}/{name}")
    except NotFound:
        return False
    want = base64.b64encode(local.kubeconfig_path.read_bytes()).decode()
    return bool((secret.get("data") or {}).get(KUBECONFIG_KEY) == want)


def _kubeconfig_secret(cluster: FakeCluster, name: str, kubeconfig: str) -> dict[str, Any]:
    """The Secret layout MultiKueue and Karmada read: key ``kubeconfig``; owned by the cluster,
    so the host's garbage collector removes it with the FakeCluster."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": cluster.metadata["namespace"],
            "labels": {"fakefleet.dev/cluster": cluster.metadata["name"]},
            "ownerReferences": [{
                "apiVersion": cluster.apiVersion, "kind": "FakeCluster",
                "name": cluster.metadata["name"], "uid": cluster.metadata["uid"],
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "data": {KUBECONFIG_KEY: base64.b64encode(kubeconfig.encode()).decode()},
    }
