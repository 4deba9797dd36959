"""kopf glue for FakeCluster: observe, call the pure planner, apply its actions, report status.

Runs on create, update and resume (so an operator restart adopts or restarts what exists, with
the same ports and data) and on a timer (to heal, and to refresh the node counts its engine
wrote into the pools). Deletion goes through kopf's finalizer: the engine stops, then a local
control plane stops and its etcd data is purged, or the fake nodes are deleted from an adopted
cluster. While the cluster is not Ready its pools say why (no engine writes their status then).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import kopf

from operators.api import restores
from operators.api.base import API_VERSION
from operators.api.clusters import KUBECONFIG_KEY, FakeCluster, FakeClusterStatus
from operators.api.injections import read_entries
from operators.api.nodepools import FakeNodePool
from operators.api.status import pool_status
from operators.controlplane.components import Profile
from operators.controlplane.detaching import record_path, running_as_recorded
from operators.controlplane.errors import BinaryError, ControlPlaneError, PortInUseError
from operators.controlplane.state import StateDir
from operators.controlplane.substrate import ClusterOptions
from operators.engine import authorizing
from operators.engine.registering import remove_all
from operators.handlers import addons
from operators.handlers.provisioning import TEARDOWN, Provisioning
from operators.handlers.runtime import Member, Runtime, wait_until_none
from operators.k8s import owning
from operators.k8s.client import Client
from operators.k8s.config import ClusterAccess, load_kubeconfig, load_kubeconfig_file
from operators.k8s.errors import ConfigError, K8sError, NotFound, NotOwned, brief
from operators.k8s.times import parse, rfc3339
from operators.reconciling import clusters as planning
from primitives import keys
from primitives.files import private_directory, write_private

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT = 120.0
#: A component a fault stops gets this long after SIGTERM before SIGKILL (s).
FAULT_STOP_TIMEOUT = 1.0
#: How often an adopted cluster's API server is asked again whether it answers (s).
VERSION_RECHECK = 15.0
#: How long after its deletion an adopted cluster whose fake nodes cannot be deleted is retried.
DRAIN_GIVE_UP = 300.0
CLUSTERS = "/apis/fakefleet.dev/v1alpha1/namespaces/{namespace}/fakeclusters/{name}"
POOLS = "/apis/fakefleet.dev/v1alpha1/namespaces/{namespace}/fakenodepools"
SECRETS = "/api/v1/namespaces/{namespace}/secrets"


async def reconcile(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Create/update/resume handler and timer of FakeCluster."""
    runtime: Runtime = memo.runtime
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    key = planning.cluster_key(namespace, name)
    async with runtime.lock(key):
        # The object as it is now: kopf's copy may predate our last status write, and
        # conditions computed against it would bring back an old lastTransitionTime.
        try:
            cluster = FakeCluster.model_validate(
                await runtime.host.get(CLUSTERS.format(namespace=namespace, name=name)))
        except NotFound:
            return  # deleted meanwhile
        annotations = cluster.metadata.get("annotations")
        hold = restores.read_hold(annotations)
        if hold is not None:
            await hold_for_restore(runtime, cluster, key, hold)
            return
        # Traced only if it changes something: most runs (the timer's) find nothing to do.
        with Provisioning(runtime.tracer, namespace, name, cluster.metadata.get("annotations"),
                          backend=cluster.spec.controlPlane.backend) as provisioning:
            held = await hold_components(runtime, cluster, key, changing=provisioning.open)
            observed = await observe(runtime, cluster, key)
            if held:
                observed = planning.Observed(**{**observed.__dict__, "error": held})
            error, stalled, delay = "", False, 5.0
            actions = planning.plan(cluster, observed)
            reported = cluster.status
            if actions:
                provisioning.open([type(a).__name__ for a in actions])
                logger.info("cluster %s: %s", key, ", ".join(type(a).__name__ for a in actions))
            if actions and reported is not None and reported.phase == "Ready" \
                    and not adopting(StateDir(runtime.state_dir), cluster, key, actions):
                # Say what is missing before mending it: a restart shows as not Ready. (A cluster
                # not Ready keeps its last message, say why it failed, until there is news.)
                reported = await report(runtime, cluster, planning.Observed(**{
                    **observed.__dict__, "addons": addons.reported(runtime, reported)}),
                    reported)
            for action in actions:
                try:
                    await execute(runtime, cluster, key, action)
                except (ControlPlaneError, K8sError) as failure:
                    error = brief(failure)  # it goes into the status
                    # A missing or unbuildable binary, a kubeconfig that cannot be used, or a
                    # user's object where ours would go does not fix itself: say so, and let
                    # the timer try again later.
                    stalled = isinstance(failure, BinaryError | ConfigError | NotOwned)
                    # A port still held by a stopping apiserver of an earlier run frees quickly.
                    delay = 2.0 if isinstance(failure, PortInUseError) else 5.0
                    logger.warning("cluster %s: %s failed: %s", key, type(action).__name__, error)
                    break
                except Exception as failure:  # a defect of ours: the user must still hear of it
                    error = brief(f"{type(action).__name__} failed unexpectedly: {failure!r}")
                    logger.exception("cluster %s: %s", key, error)
                    break
            if error:
                provisioning.fail(error)
            if actions:  # something changed: look again (the timer's no-op ticks do not)
                observed = await observe(runtime, cluster, key)
            observed = planning.Observed(**{**observed.__dict__, "error": error,
                                            "stalled": stalled}) if error else observed
            conditions = await addons.reconcile(
                runtime, cluster, key, control_plane_running=observed.control_plane_running)
            observed = planning.Observed(**{**observed.__dict__, "addons": conditions})
            await report(runtime, cluster, observed, reported)
            if restores.held(annotations) is not None:  # the hold is over: say it is released
                await _acknowledge(runtime, cluster, None)
    if error and not stalled:
        raise kopf.TemporaryError(error, delay=delay)


async def delete(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Finalizer: stop the engine, then purge a local member or drain an adopted one."""
    runtime: Runtime = memo.runtime
    cluster = FakeCluster.model_validate(dict(body))
    key = planning.cluster_key(cluster.metadata["namespace"], cluster.metadata["name"])
    async with runtime.lock(key):
        actions = planning.plan(cluster, planning.Observed(), deleting=True)
        with Provisioning(runtime.tracer, cluster.metadata["namespace"],
                          cluster.metadata["name"], cluster.metadata.get("annotations"),
                          backend=cluster.spec.controlPlane.backend,
                          name_of_span=TEARDOWN) as teardown:
            teardown.open([type(action).__name__ for action in actions])
            await addons.remove(runtime, key)
            for action in actions:
                await execute(runtime, cluster, key, action)
        await _tell_pools(runtime, cluster, f"FakeCluster {cluster.metadata['name']} is gone: "
                                            f"create it again, or delete this pool")
    runtime.locks.pop(key, None)
    runtime.versions.pop(key, None)


async def hold_components(runtime: Runtime, cluster: FakeCluster, key: str, *,
                          changing: Callable[[list[str]], None] | None = None) -> str:
    """Stop the components a FaultPlan holds down (entries in the FakeCluster's
    fakefleet.dev/faults annotation) and start again those no entry holds; what is held, for
    the status message. Observed anew each time: after an operator restart the entries still
    say what must stay down. ``changing`` hears of each stop and start before it is made (the
    reconcile's span opens then)."""
    local = runtime.substrate.clusters.get(key)
    if local is None:
        return ""
    entries, _ = read_entries(cluster.metadata.get("annotations"))
    held = {component: entry.id for entry in entries if entry.state == "inject"
            for component in entry.stop}
    for component, process in local.processes.items():
        if component in held and process.supervised:
            if changing is not None:
                changing([f"Stop {component}"])
            logger.info("cluster %s: stopping %s for fault %s", key, component, held[component])
            # An outage, not a shutdown: no graceful drain of requests and watches.
            await process.stop(timeout=FAULT_STOP_TIMEOUT)
            if component == "kube-apiserver":
                runtime.versions.pop(key, None)
        elif component not in held and not process.supervised:
            if changing is not None:
                changing([f"Start {component}"])
            logger.info("cluster %s: starting %s again: no fault holds it", key, component)
            await process.start()
    return "; ".join(f"{component} stopped by fault {entry}" for component, entry in
                     sorted(held.items()) if component in local.processes)


async def hold_for_restore(runtime: Runtime, cluster: FakeCluster, key: str,
                           hold: restores.RestoreHold) -> None:
    """Run of the member only what a snapshot restore lets run (:mod:`operators.api.restores`):
    the add-ons always stop; the engine, the controller-manager and the scheduler stop unless
    named; the API server runs only when named (started, for a member created by the restore).
    Then say so in the FakeCluster's annotation, which the restore waits for."""
    if cluster.spec.controlPlane.backend != "local":
        await report(runtime, cluster, planning.Observed(
            error="a snapshot restore holds it, but only local members can be restored: "
                  f"remove annotation {keys.RESTORE}", stalled=True), cluster.status)
        return
    await addons.remove(runtime, key)
    state = StateDir(runtime.state_dir)
    apiserver = "kube-apiserver" in hold.run
    local = runtime.substrate.clusters.get(key)
    # An operator that starts while a hold is on knows nothing of the member yet: what an
    # earlier one left running is adopted first, so that it can be stopped.
    components = ("kube-apiserver", "kube-scheduler", "kube-controller-manager")
    left = [kind for kind in components
            if running_as_recorded(record_path(state.component_log(key, kind)))]
    if local is None and (apiserver or left):
        await execute(runtime, cluster, key, planning.StartControlPlane())
        local = runtime.substrate.clusters[key]
    if not runtime.engine_running(key) and running_as_recorded(
            record_path(state.engine_log(key))):
        await execute(runtime, cluster, key, planning.StartEngine())
    if "engine" not in hold.run:
        await runtime.stop_engine(key)
    if local is not None:
        # Dependants first, as a member stops; the API server last.
        for component in ("kube-controller-manager", "kube-scheduler", "kube-apiserver"):
            process = local.processes.get(component)
            wanted = apiserver and component == "kube-apiserver"
            if process is not None and process.supervised and not wanted:
                logger.info("cluster %s: stopping %s for restore %s", key, component, hold.id)
                # Killed after a moment rather than drained: its data is about to be replaced.
                await process.stop(timeout=FAULT_STOP_TIMEOUT)
                if component == "kube-apiserver":
                    runtime.versions.pop(key, None)
            elif process is not None and wanted and not process.supervised:
                await process.start()
    if "engine" in hold.run and not runtime.engine_running(key):
        if not await _answers(runtime, cluster, key):
            return  # the API server is starting: the next reconcile starts the engine
        await execute(runtime, cluster, key, planning.StartEngine())
    if restores.held(cluster.metadata.get("annotations")) != hold.token:
        await _acknowledge(runtime, cluster, hold.token)
    observed = await observe(runtime, cluster, key)
    # Never Ready while held, whatever runs: its scheduler and controller-manager do not.
    await report(runtime, cluster, planning.Observed(**{
        **observed.__dict__, "control_plane_running": False,
        "error": f"held by the restore of a snapshot ({hold.id}): "
                 f"{', '.join(hold.run) or 'nothing'} running"}), cluster.status)


async def _answers(runtime: Runtime, cluster: FakeCluster, key: str,
                   timeout: float = 60.0) -> bool:
    """Whether the member's API server answers within ``timeout`` (just started)."""
    deadline = time.monotonic() + timeout
    while not (await _version(runtime, cluster, key))[0]:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)
    return True


async def _acknowledge(runtime: Runtime, cluster: FakeCluster, token: str | None) -> None:
    path = CLUSTERS.format(namespace=cluster.metadata["namespace"],
                           name=cluster.metadata["name"])
    with contextlib.suppress(NotFound):
        await runtime.host.patch(path, {"metadata": {"annotations": {
            keys.RESTORE_HELD: token}}})


def adopting(state: StateDir, cluster: FakeCluster, key: str,
             actions: list[planning.Action]) -> bool:
    """Whether the actions start only processes that run already, as an earlier operator
    recorded them: this one adopts them, nothing is missing, and the cluster stays Ready."""
    logs = []
    for action in actions:
        if isinstance(action, planning.StartControlPlane):
            spec = cluster.spec.controlPlane
            options = ClusterOptions(scheduler=spec.scheduler,
                                     controller_manager=spec.controllerManager)
            logs += [state.component_log(key, kind) for kind in options.components]
        elif isinstance(action, planning.StartEngine):
            logs.append(state.engine_log(key))
        elif not isinstance(action, planning.ConnectExternal | planning.WriteKubeconfigSecret):
            return False
    return all(running_as_recorded(record_path(log)) for log in logs)


async def observe(runtime: Runtime, cluster: FakeCluster, key: str) -> planning.Observed:
    local = runtime.substrate.clusters.get(key)
    if cluster.spec.controlPlane.backend == "local":
        running = local is not None and local.apiserver.running
        endpoint = local.endpoint if local else ""
    else:
        member = runtime.external.get(key)
        running = member is not None
        endpoint = member.access.server if member else ""
    # Running means answering: a control plane that does not say its version yet is starting;
    # an adopted one that stops answering is not Ready, and the status says why.
    version, problem = await _version(runtime, cluster, key) if running else ("", "")
    release = None if running or cluster.spec.controlPlane.backend != "local" else \
        await asyncio.to_thread(runtime.releases.observe, cluster.spec.kubernetesVersion)
    nodes, ready = await _node_counts(runtime, cluster)
    endpoint_file = runtime.engine_endpoint(key)
    return planning.Observed(
        dcgm_endpoint=endpoint_file.dcgm_url if endpoint_file else "",
        control_plane_running=running and bool(version),
        secret_current=local is not None and await _secret_current(runtime, cluster, local),
        engine_running=runtime.engine_running(key),
        endpoint=endpoint,
        version=version,
        nodes=nodes,
        ready_nodes=ready,
        error=problem if cluster.spec.controlPlane.backend == "external" else "",
        hub=runtime.hub_links.get(key),
        release=release,
    )


async def execute(runtime: Runtime, cluster: FakeCluster, key: str,
                  action: planning.Action) -> None:
    spec = cluster.spec.controlPlane
    namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
    if isinstance(action, planning.BuildRelease):
        runtime.releases.start(cluster.spec.kubernetesVersion)
    elif isinstance(action, planning.StartControlPlane):
        binaries = await asyncio.to_thread(runtime.releases.binaries,
                                           cluster.spec.kubernetesVersion)
        if binaries is None:
            raise BinaryError(f"Kubernetes {cluster.spec.kubernetesVersion} is not in the cache "
                              f"yet: it is being built")
        await runtime.substrate.add_cluster(key, ClusterOptions(
            scheduler=spec.scheduler, controller_manager=spec.controllerManager,
            profile=Profile(spec.profile) if spec.profile else runtime.default_profile,
            binaries=binaries,
            node_monitor_grace=spec.node_grace,
        ))
    elif isinstance(action, planning.ConnectExternal):
        runtime.external[key] = await _connect(runtime, namespace, key, action)
    elif isinstance(action, planning.WriteKubeconfigSecret):
        local = runtime.substrate.clusters[key]
        await owning.apply(runtime.host, _kubeconfig_secret(
            cluster, action.name, local.kubeconfig_path.read_text()), "secrets",
            owner=kubeconfig_owner(cluster))
    elif isinstance(action, planning.StartEngine):
        member = runtime.external.get(key)
        kubelet_pki = None
        if member is not None:
            kubeconfig = member.kubeconfig  # an adopted cluster: the credentials it was given
        else:
            local = runtime.substrate.clusters[key]
            async with Client.connect(load_kubeconfig_file(local.kubeconfig_path),
                                      connections=1) as admin:
                await authorizing.grant(admin)
            kubeconfig = local.engine_kubeconfig_path
            kubelet_pki = local.kubelet_pki.directory
        await runtime.start_engine(key, namespace, name, kubeconfig, kubelet_pki=kubelet_pki,
                                   node_grace=spec.node_grace)
    elif isinstance(action, planning.StopEngine):
        await runtime.stop_engine(key)
    elif isinstance(action, planning.DrainNodes):
        await _drain(runtime, cluster, key)
    elif isinstance(action, planning.RemoveControlPlane):
        await runtime.substrate.remove_cluster(key, purge=True)


async def report(runtime: Runtime, cluster: FakeCluster, observed: planning.Observed,
                 previous: FakeClusterStatus | None) -> FakeClusterStatus:
    """Patch the status subresource unless it already says this; return what it now says.
    While the cluster is not Ready, its pools say so too."""
    status = planning.status(cluster, observed, now=rfc3339(), previous=previous)
    if status.phase != "Ready":
        ready = next((c for c in status.conditions if c.type == "Ready"), None)
        await _tell_pools(runtime, cluster, f"FakeCluster {cluster.metadata['name']} is "
                                            f"{status.phase}: {ready.message if ready else ''}")
    if status == previous:
        return status
    if previous is None or status.phase != previous.phase:
        logger.info("cluster %s/%s: %s", cluster.metadata["namespace"], cluster.metadata["name"],
                    status.phase)
    path = CLUSTERS.format(namespace=cluster.metadata["namespace"],
                           name=cluster.metadata["name"])
    with contextlib.suppress(NotFound):  # deleted meanwhile
        await runtime.host.patch(f"{path}/status", {"status": status.model_dump(mode="json")})
    return status


async def _connect(runtime: Runtime, namespace: str, key: str,
                   action: planning.ConnectExternal) -> Member:
    """Read the adopted cluster's kubeconfig from its Secret: it may hold no file paths or
    commands (a tenant must not make the operator read its files or run its commands)."""
    source = f"Secret {namespace}/{action.secret}"
    try:
        secret = await runtime.host.get(f"{SECRETS.format(namespace=namespace)}/{action.secret}")
    except NotFound:
        raise ConfigError(f"{source} does not exist: create it with the kubeconfig of the "
                          f"cluster to adopt under key {action.key!r}") from None
    data = (secret.get("data") or {}).get(action.key)
    if data is None:
        raise ConfigError(f"{source} has no key {action.key!r}: put the kubeconfig of the "
                          f"cluster to adopt there")
    try:
        text = base64.b64decode(data).decode()
    except ValueError:  # not base64, or not UTF-8 (a UTF-16 or gzipped file)
        raise ConfigError(f"{source} key {action.key!r} is not a kubeconfig in UTF-8 text: "
                          f"store the file as plain UTF-8 YAML") from None
    access = load_kubeconfig(text, untrusted=True, source=source)
    # The engine reads the same kubeconfig: a private file in the cluster's directory.
    state = StateDir(runtime.state_dir)
    private_directory(state.cluster(key))
    path = state.member_kubeconfig(key)
    changed = not path.exists() or path.read_text() != text
    write_private(path, text.encode())
    if changed and runtime.engine_running(key):
        # New credentials in the Secret: the engine read the old file at its start, so it
        # starts again (the next reconcile does) with the new one.
        logger.info("cluster %s: the kubeconfig in %s changed; restarting the engine", key,
                    source)
        await runtime.stop_engine(key)
    return Member(access, path)


def member_access(runtime: Runtime, cluster: FakeCluster, key: str) -> ClusterAccess | None:
    if cluster.spec.controlPlane.backend == "external":
        member = runtime.external.get(key)
        return member.access if member else None
    local = runtime.substrate.clusters.get(key)
    return load_kubeconfig_file(local.kubeconfig_path) if local else None


def linked_access(runtime: Runtime, cluster: FakeCluster, key: str) -> ClusterAccess | None:
    """What the hub link reads the member's workload Jobs through: :func:`member_access`, or,
    for a member this operator has not started or adopted yet, the kubeconfig an earlier
    operator left for it: a local member's admin kubeconfig (same ports and credentials on
    restart), an adopted cluster's copy of its Secret's. None only for a member that never
    had an API server here: its Hello then lists no Jobs, which is true only of such a member
    (after an operator restart, a None here told the hub that every Job the member ran was
    deleted, and the hub failed them)."""
    access = member_access(runtime, cluster, key)
    if access is not None:
        return access
    state = StateDir(runtime.state_dir)
    left = state.member_kubeconfig(key) if cluster.spec.controlPlane.backend == "external" \
        else state.kubeconfig(key)
    return load_kubeconfig_file(left) if left.exists() else None


async def _version(runtime: Runtime, cluster: FakeCluster, key: str) -> tuple[str, str]:
    """What the member's API server reports, or why there is nothing: a local control plane is
    asked once per start (its processes are watched); an adopted cluster again every
    VERSION_RECHECK seconds, as nothing else would tell that it went away or stopped taking
    its credentials."""
    cached = runtime.versions.get(key)
    external = cluster.spec.controlPlane.backend == "external"
    if cached is not None and not (external and time.monotonic() - cached[1] > VERSION_RECHECK):
        return cached[0], ""
    access = member_access(runtime, cluster, key)
    if access is None:
        return "", ""
    try:
        async with Client.connect(access, connections=1, timeout=5) as client:
            version = str((await client.get("/version")).get("gitVersion"))
    except K8sError as error:
        runtime.versions.pop(key, None)
        logger.info("cluster %s: no version: %s", key, error)
        return "", brief(f"the API server at {access.server} does not answer: {error}")
    runtime.versions[key] = (version, time.monotonic())
    return version, ""


async def _drain(runtime: Runtime, cluster: FakeCluster, key: str) -> None:
    """Delete the fake nodes from an adopted cluster (the engine has stopped).

    A failure (no answer, 429, 5xx, a refused delete) is retried, saying why: one hiccup must
    not leave every fake node behind. A cluster that cannot be drained for DRAIN_GIVE_UP after
    the deletion, or whose kubeconfig is gone or unusable, is let go with a warning.
    """
    access = member_access(runtime, cluster, key)
    try:
        if access is None:
            runtime.external[key] = await _connect(
                runtime, cluster.metadata["namespace"], key, planning.ConnectExternal(
                    *_secret_ref(cluster)))
            access = runtime.external[key].access
        async with Client.connect(access, connections=8, timeout=10) as client:
            left = await wait_until_none(lambda: remove_all(client, key), DRAIN_TIMEOUT)
    except K8sError as error:
        deleted = cluster.metadata.get("deletionTimestamp")
        waited = time.time() - parse(deleted) if deleted else 0.0
        if not isinstance(error, ConfigError) and waited < DRAIN_GIVE_UP:
            raise kopf.TemporaryError(
                f"cannot delete the fake nodes of the adopted cluster ({error}); trying again "
                f"until {DRAIN_GIVE_UP:.0f}s after the deletion", delay=10) from error
        logger.warning("cluster %s: its fake nodes could not be deleted (%s); they stay there",
                       key, error)
        return
    if left:
        raise kopf.TemporaryError(f"{left} fake nodes still being deleted from the adopted "
                                  f"cluster", delay=5)
    runtime.external.pop(key, None)


def _secret_ref(cluster: FakeCluster) -> tuple[str, str]:
    ref = cluster.spec.controlPlane.kubeconfigSecretRef
    assert ref is not None, "the CRD's CEL rule requires kubeconfigSecretRef"
    return ref.name, ref.key


async def _pools_of(runtime: Runtime, cluster: FakeCluster) -> list[FakeNodePool]:
    found = await runtime.host.get(POOLS.format(namespace=cluster.metadata["namespace"]))
    return [FakeNodePool.model_validate(item) for item in found.get("items") or []
            if item["spec"].get("clusterRef") == cluster.metadata["name"]]


async def _node_counts(runtime: Runtime, cluster: FakeCluster) -> tuple[int, int]:
    """Nodes and Ready nodes, as the cluster's engine reports them in its pools."""
    pools = await _pools_of(runtime, cluster)
    return (sum(pool.status.replicas for pool in pools if pool.status),
            sum(pool.status.readyReplicas for pool in pools if pool.status))


async def _tell_pools(runtime: Runtime, cluster: FakeCluster, why: str) -> None:
    """No engine writes these pools' status now: say why, where users look."""
    key = planning.cluster_key(cluster.metadata["namespace"], cluster.metadata["name"])
    if runtime.engine_running(key):
        return
    for pool in await _pools_of(runtime, cluster):
        await tell_pool(runtime, pool, why)


async def tell_pool(runtime: Runtime, pool: FakeNodePool, why: str) -> None:
    status = pool_status(pool, replicas=pool.status.replicas if pool.status else 0,
                         ready=pool.status.readyReplicas if pool.status else 0,
                         generation=pool.status.observedGeneration if pool.status else 0,
                         now=rfc3339(), waiting=why)
    if status == pool.status:
        return
    path = f"{POOLS.format(namespace=pool.metadata['namespace'])}/{pool.metadata['name']}"
    with contextlib.suppress(NotFound):
        await runtime.host.patch(f"{path}/status", {"status": status.model_dump(mode="json")})


async def _secret_current(runtime: Runtime, cluster: FakeCluster, local: Any) -> bool:
    name = planning.kubeconfig_secret_name(cluster.metadata["name"])
    try:
        secret = await runtime.host.get(
            f"{SECRETS.format(namespace=cluster.metadata['namespace'])}/{name}")
    except NotFound:
        return False
    want = base64.b64encode(local.kubeconfig_path.read_bytes()).decode()
    return bool((secret.get("data") or {}).get(KUBECONFIG_KEY) == want)


def kubeconfig_owner(cluster: FakeCluster) -> owning.Owner:
    """The FakeCluster as the writer of its kubeconfig Secret: a Secret made before the
    ownership marker is its own too, by the owner reference or the label it carries."""
    name = cluster.metadata["name"]
    return owning.Owner(f"FakeCluster/{name}", legacy=owning.any_of(
        owning.owner_reference(cluster.metadata.get("uid", "")),
        owning.labelled(keys.CLUSTER, name)))


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
            "labels": {keys.CLUSTER: cluster.metadata["name"]},
            "ownerReferences": [{
                "apiVersion": API_VERSION, "kind": "FakeCluster",
                "name": cluster.metadata["name"], "uid": cluster.metadata["uid"],
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "data": {KUBECONFIG_KEY: base64.b64encode(kubeconfig.encode()).decode()},
    }
