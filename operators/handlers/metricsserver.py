"""kopf glue for a member's metrics-server: observe, call the pure planner, apply, report.

Called by the FakeCluster handler on every reconcile (create, update, resume, the 5 s timer),
like Kueue's: started when the cluster's spec wants it (by default, for a local control plane),
restarted by its supervisor when it crashes, stopped (and its APIService removed) when it is
disabled, stopped with the cluster. It dies with the operator; the next operator finds its files
(the same port and certificates) and starts it again; applying its objects is idempotent
(server-side apply).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from typing import Any

from operators.addons.metricsserver import building, planning, rendering, source
from operators.api.clusters import FakeCluster
from operators.controlplane import health, kubeconfigs
from operators.controlplane.errors import AddonError, ControlPlaneError
from operators.controlplane.files import private_directory, write_private
from operators.controlplane.limits import check_inotify
from operators.controlplane.pki import ensure_addon_pki
from operators.controlplane.ports import free_port
from operators.controlplane.state import ComponentState, MetricsServerFiles, StateDir
from operators.controlplane.substrate import LocalCluster
from operators.controlplane.supervising import Supervised, tail
from operators.handlers.runtime import Runtime
from operators.k8s.applying import collection_path
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError, NotFound

logger = logging.getLogger(__name__)

STABLE_AFTER = 60.0
PLURALS = {
    "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles", "RoleBinding": "rolebindings", "Service": "services",
    "APIService": "apiservices",
}
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"


async def reconcile(runtime: Runtime, cluster: FakeCluster, key: str, *,
                    control_plane_running: bool) -> planning.MetricsServerState | None:
    """Bring the member's metrics-server to its spec; its condition (None: not wanted)."""
    addons = runtime.metrics_servers
    if cluster.spec.metrics_server is None and not _files(runtime, key).directory.exists() \
            and key not in addons.processes:
        return None
    observed = await observe(runtime, key, control_plane_running)
    failure = ""
    actions = planning.plan(cluster, observed)
    for action in actions:
        logger.info("cluster %s: metrics-server: %s", key, type(action).__name__)
        try:
            await execute(runtime, cluster, key, action)
        except (ControlPlaneError, K8sError, OSError) as error:
            failure = f"{type(action).__name__} failed: {error}"
            logger.warning("cluster %s: metrics-server: %s", key, failure)
            break
    if actions:
        observed = await observe(runtime, key, control_plane_running)
    state = planning.condition(cluster, observed)
    if state is not None and failure:
        return planning.MetricsServerState(False, "SetupFailed", failure)
    return state


async def remove(runtime: Runtime, key: str) -> None:
    """The member is going: stop its metrics-server (its objects go with the member's data)."""
    await _stop(runtime, key)


async def observe(runtime: Runtime, key: str, control_plane_running: bool) -> planning.Observed:
    addons = runtime.metrics_servers
    binary, build_error, building_for = addons.build.observe()
    files = _files(runtime, key)
    process = addons.processes.get(key)
    port = _stored_port(files)
    live = ready = False
    if process is not None and process.running and port:
        live, _ = await health.probe(f"https://127.0.0.1:{port}/livez", health.insecure_tls())
        if live:
            ready, _ = await health.probe(f"https://127.0.0.1:{port}/readyz",
                                          health.insecure_tls())
    return planning.Observed(
        control_plane_running=control_plane_running,
        binary=binary,
        building_for=building_for,
        build_error=build_error,
        installed=files.directory.exists(),
        supervised=process is not None,
        live=live,
        ready=ready,
        hooked=key in addons.hooked,
        restarts=process.restarts if process is not None else 0,
        log_tail=tail(files.log, 200) if process is not None and not live else "",
        port=port,
        resolution=addons.resolutions.get(key, "") if process is not None else "",
    )


async def execute(runtime: Runtime, cluster: FakeCluster, key: str,
                  action: planning.Action) -> None:
    if isinstance(action, planning.BuildMetricsServer):
        runtime.metrics_servers.build.start()
    elif isinstance(action, planning.StartMetricsServer):
        await _start(runtime, cluster, key)
    elif isinstance(action, planning.HookMetricsServer):
        await _hook(runtime, key)
    elif isinstance(action, planning.StopMetricsServer):
        await _stop(runtime, key, unhook=action.unhook)


async def _start(runtime: Runtime, cluster: FakeCluster, key: str) -> None:
    local = runtime.substrate.clusters.get(key)
    if local is None:
        raise AddonError("the member's control plane is not running")
    binary = building.find()
    if binary is None:
        raise AddonError("the metrics-server binary is not in the cache: it is being built")
    await asyncio.to_thread(check_inotify, f"metrics-server on {key}", ["metrics-server"])
    spec = cluster.spec.metrics_server
    assert spec is not None, "plan() starts metrics-server only when it is wanted"
    manifests = await _manifests(runtime)
    files = _files(runtime, key)
    private_directory(files.directory)
    port = _port(files)
    pki = await asyncio.to_thread(
        ensure_addon_pki, files.pki, local.pki, rendering.USER,
        ca_name="fakefleet-metrics-server-ca", serving_name=rendering.SERVICE_HOST,
        hosts=(rendering.SERVICE_HOST, "localhost", "127.0.0.1"))
    write_private(files.kubeconfig, kubeconfigs.render(
        cluster=key, server=local.endpoint, ca_cert=local.pki.ca_cert,
        client_cert=pki.client_cert, client_key=pki.client_key,
        user="metrics-server").encode())
    async with _member(local) as client:
        for obj in rendering.rbac(manifests):
            await _apply(client, obj)
    process = Supervised(
        f"{key}/metrics-server",
        rendering.argv(binary, kubeconfig=files.kubeconfig, port=port, cert=pki.serving_cert,
                       key=pki.serving_key, resolution=spec.resolution),
        log_path=files.log, stable_after=STABLE_AFTER)
    await process.start()
    addons = runtime.metrics_servers
    addons.processes[key] = process
    addons.resolutions[key] = spec.resolution
    addons.hooked.discard(key)


async def _hook(runtime: Runtime, key: str) -> None:
    """Route metrics.k8s.io to the running metrics-server."""
    local = runtime.substrate.clusters[key]
    files = _files(runtime, key)
    manifests = await _manifests(runtime)
    port = _stored_port(files)
    async with _member(local) as client:
        await _apply(client, rendering.service(port))
        await _apply(client, rendering.apiservice(
            manifests, port=port, ca_pem=(files.pki / "ca.crt").read_bytes()))
    runtime.metrics_servers.hooked.add(key)


async def _stop(runtime: Runtime, key: str, *, unhook: bool = False) -> None:
    """Stop metrics-server; with ``unhook``, delete its APIService and Service, and only then
    its files: until that succeeded they say that there is something left to undo."""
    addons = runtime.metrics_servers
    process = addons.processes.pop(key, None)
    addons.hooked.discard(key)
    addons.resolutions.pop(key, None)
    if process is not None:
        await process.stop()
    if not unhook:
        return
    local = runtime.substrate.clusters.get(key)
    if local is None or not local.apiserver.running:
        raise AddonError("metrics-server stopped, but its APIService cannot be removed while "
                         "the cluster's API server is down; trying again")
    async with _member(local) as client:
        with contextlib.suppress(NotFound):
            await client.delete(f"{APISERVICES}/{rendering.APISERVICE}")
        with contextlib.suppress(NotFound):
            await client.delete(f"/api/v1/namespaces/{rendering.NAMESPACE}/services/"
                                f"{rendering.SERVICE}")
    shutil.rmtree(_files(runtime, key).directory, ignore_errors=True)


def components(runtime: Runtime) -> list[ComponentState]:
    """Each member's metrics-server, as ``fakefleet status`` lists it."""
    found = []
    for key, process in runtime.metrics_servers.processes.items():
        files = _files(runtime, key)
        port = _stored_port(files)
        if not port:
            continue
        found.append(ComponentState(
            cluster=key, name="metrics-server", pid=process.pid, port=port,
            healthUrl=f"https://127.0.0.1:{port}/livez", log=str(files.log),
            restarts=process.restarts))
    return found


def _files(runtime: Runtime, key: str) -> MetricsServerFiles:
    return StateDir(runtime.state_dir).metrics_server(key)


def _port(files: MetricsServerFiles) -> int:
    """The port it had before (the APIService points there), else a free one."""
    port = _stored_port(files)
    if port:
        return port
    port = free_port()
    write_private(files.port, f"{port}\n".encode())
    return port


def _stored_port(files: MetricsServerFiles) -> int:
    try:
        return int(files.port.read_text())
    except (OSError, ValueError):
        return 0


async def _manifests(runtime: Runtime) -> source.Manifests:
    addons = runtime.metrics_servers
    if addons.manifests is None:
        directory = await asyncio.to_thread(source.module_dir)
        addons.manifests = await asyncio.to_thread(source.load, directory)
    return addons.manifests


def _member(local: LocalCluster) -> Client:
    return Client.connect(load_kubeconfig_file(local.kubeconfig_path), connections=4,
                          timeout=30)


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    path = f"{collection_path(obj, PLURALS[obj['kind']])}/{obj['metadata']['name']}"
    return await client.server_side_apply(path, obj, field_manager=rendering.FIELD_MANAGER)
