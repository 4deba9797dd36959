"""kopf glue for a member's Kueue add-on: observe, call the pure planner, apply, report.

Called by the FakeCluster handler on every reconcile (create, update, resume, the 5 s timer), so
Kueue is supervised like the member's control plane: started when ``spec.addons.kueue`` asks
for it, restarted by its supervisor when it crashes, stopped (and its webhooks removed) when the
add-on goes, stopped with the cluster. Kueue dies with the operator; the next operator finds
its files (same ports, same certificates) and starts it again: applying its manifests is
idempotent (server-side apply), so nothing is lost or doubled.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from operators.addons.kueue import KUEUE_VERSION, building, planning, rendering, source
from operators.api.clusters import FakeCluster
from operators.controlplane import health, kubeconfigs
from operators.controlplane.errors import AddonError, ControlPlaneError
from operators.controlplane.files import private_directory, write_private
from operators.controlplane.limits import check_inotify
from operators.controlplane.pki import ensure_kueue_pki, ensure_serving_pair
from operators.controlplane.ports import free_port
from operators.controlplane.state import ComponentState, KueueFiles, StateDir
from operators.controlplane.substrate import LocalCluster
from operators.controlplane.supervising import Supervised, tail
from operators.handlers.runtime import Runtime
from operators.k8s.applying import CRDS, collection_path
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError, NotFound

logger = logging.getLogger(__name__)

#: Kueue v0.17 reads its metrics serving certificate from this fixed path whenever its internal
#: cert management is off (cmd/kueue/main.go); nothing verifies it, so one self-signed pair
#: serves every Kueue on the host.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
KUEUE_STABLE_AFTER = 60.0
ESTABLISHED_TIMEOUT = 60.0
PLURALS = {
    "Namespace": "namespaces", "Secret": "secrets",
    "CustomResourceDefinition": "customresourcedefinitions",
    "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles", "RoleBinding": "rolebindings",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "MultiKueueCluster": "multikueueclusters", "MultiKueueConfig": "multikueueconfigs",
}
CLUSTERS = "/apis/fakefleet.dev/v1alpha1/namespaces/{namespace}/fakeclusters/{name}"
MULTIKUEUE_CLUSTERS = f"/apis/{planning.KUEUE_API}/multikueueclusters"


async def reconcile(runtime: Runtime, cluster: FakeCluster, key: str, *,
                    control_plane_running: bool) -> planning.KueueState | None:
    """Bring the member's Kueue to its spec; the KueueReady condition (None: not asked for)."""
    if cluster.spec.kueue is None and not _files(runtime, key).directory.exists() \
            and key not in runtime.kueue.processes:
        return None  # the common case: no add-on, nothing to observe
    observed = await observe(runtime, cluster, key, control_plane_running)
    actions = planning.plan(cluster, observed)
    failure = ""
    for action in actions:
        logger.info("cluster %s: kueue: %s", key, type(action).__name__)
        try:
            await execute(runtime, cluster, key, action)
        except (ControlPlaneError, K8sError, OSError) as error:
            failure = f"{type(action).__name__} failed: {error}"
            logger.warning("cluster %s: kueue: %s", key, failure)
            break
    if actions:
        observed = await observe(runtime, cluster, key, control_plane_running)
    state = planning.condition(cluster, observed)
    if state is not None and failure:
        return planning.KueueState(False, "SetupFailed", failure)
    return state


async def remove(runtime: Runtime, key: str) -> None:
    """The member is going: stop its Kueue (its webhooks go with the member's data)."""
    await _stop(runtime, key)


async def observe(runtime: Runtime, cluster: FakeCluster, key: str,
                  control_plane_running: bool) -> planning.Observed:
    addons = runtime.kueue
    binary, build_error, building_for = addons.build.observe()
    files = _files(runtime, key)
    process = addons.processes.get(key)
    ready = False
    ports = _stored_ports(files)
    if process is not None and process.running and ports is not None:
        ready, _ = await health.probe(f"http://127.0.0.1:{ports.health}/readyz")
    workers: tuple[planning.Worker, ...] = ()
    if cluster.spec.kueue is not None and process is not None and control_plane_running:
        workers = await _observe_workers(runtime, cluster, key)
    return planning.Observed(
        control_plane_running=control_plane_running,
        binary=binary,
        building_for=building_for,
        build_error=build_error,
        installed=files.directory.exists(),
        supervised=process is not None,
        ready=ready,
        hooked=key in addons.hooked,
        restarts=process.restarts if process is not None else 0,
        log_tail=tail(files.log, 200) if process is not None and not ready else "",
        webhook_port=ports.webhook if ports else 0,
        workers=workers,
        multikueue_applied=addons.applied.get(key, ""),
    )


async def execute(runtime: Runtime, cluster: FakeCluster, key: str,
                  action: planning.Action) -> None:
    if isinstance(action, planning.BuildKueue):
        runtime.kueue.build.start()
    elif isinstance(action, planning.StartKueue):
        await _start(runtime, cluster, key)
    elif isinstance(action, planning.HookKueue):
        await _hook(runtime, key)
    elif isinstance(action, planning.StopKueue):
        await _stop(runtime, key, unhook=action.unhook)
    elif isinstance(action, planning.ApplyMultiKueue):
        await _apply_multikueue(runtime, key, action)


async def _start(runtime: Runtime, cluster: FakeCluster, key: str) -> None:
    """Set up the member for Kueue and start it; the webhooks follow once it is ready."""
    local = runtime.substrate.clusters.get(key)
    if local is None:
        raise AddonError("the member's control plane is not running")
    binary = building.find()
    if binary is None:
        raise AddonError("the Kueue binary is not in the cache: it is being built")
    await asyncio.to_thread(check_inotify, f"Kueue on {key}", ["kueue"])
    manifests = await _manifests(runtime)
    files = _files(runtime, key)
    private_directory(files.directory)
    ports = _ports(files)
    pki = await asyncio.to_thread(ensure_kueue_pki, files.pki, local.pki, rendering.USER)
    await asyncio.to_thread(_ensure_metrics_cert)
    spec = cluster.spec.kueue
    assert spec is not None, "plan() starts Kueue only when the add-on is asked for"
    multikueue = (rendering.MultiKueueSettings(spec.multiKueue.workerLostTimeout)
                  if spec.multiKueue is not None else None)
    write_private(files.config, yaml.safe_dump(
        rendering.configuration(ports, files.pki, multikueue), sort_keys=False).encode())
    write_private(files.kubeconfig, kubeconfigs.render(
        cluster=key, server=local.endpoint, ca_cert=local.pki.ca_cert,
        client_cert=pki.client_cert, client_key=pki.client_key, user="kueue").encode())
    async with _member(local) as client:
        await _apply(client, rendering.namespace())
        crds = rendering.crds(manifests, port=ports.webhook, ca_pem=pki.ca_cert.read_bytes())
        for crd in crds:
            await _apply(client, crd)
        await _wait_established(client, [crd["metadata"]["name"] for crd in crds])
        for obj in rendering.rbac(manifests):
            await _apply(client, obj)
    process = Supervised(
        f"{key}/kueue",
        rendering.argv(binary, config=files.config, kubeconfig=files.kubeconfig),
        log_path=files.log, stable_after=KUEUE_STABLE_AFTER)
    await process.start()
    runtime.kueue.processes[key] = process
    runtime.kueue.hooked.discard(key)
    runtime.kueue.applied.pop(key, None)


async def _hook(runtime: Runtime, key: str) -> None:
    """Point the member's webhooks (and CRD conversions) at the running Kueue."""
    local = runtime.substrate.clusters[key]
    files = _files(runtime, key)
    manifests = await _manifests(runtime)
    pki_ca = (files.pki / "ca.crt").read_bytes()
    port = _read_ports(files).webhook
    async with _member(local) as client:
        for configuration in rendering.webhook_configurations(manifests, port=port,
                                                               ca_pem=pki_ca):
            await _apply(client, configuration)
    runtime.kueue.hooked.add(key)


async def _stop(runtime: Runtime, key: str, *, unhook: bool = False) -> None:
    """Stop Kueue; with ``unhook``, delete its webhooks, and only then its files: until that
    succeeded they say that there is something left to undo (after a restart too)."""
    process = runtime.kueue.processes.pop(key, None)
    runtime.kueue.hooked.discard(key)
    runtime.kueue.applied.pop(key, None)
    if process is not None:
        await process.stop()
    if not unhook:
        return
    local = runtime.substrate.clusters.get(key)
    if local is None or not local.apiserver.running:
        raise AddonError("Kueue stopped, but its webhooks cannot be removed while the "
                         "cluster's API server is down; trying again")
    manifests = await _manifests(runtime)
    async with _member(local) as client:
        for plural, name in rendering.webhook_configuration_names(manifests):
            with contextlib.suppress(NotFound):
                await client.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}")
    shutil.rmtree(_files(runtime, key).directory, ignore_errors=True)


async def _apply_multikueue(runtime: Runtime, key: str,
                            action: planning.ApplyMultiKueue) -> None:
    async with _member(runtime.substrate.clusters[key]) as client:
        await apply_multikueue(client, action, key=key)
    runtime.kueue.applied[key] = action.fingerprint


async def apply_multikueue(client: Client, action: planning.ApplyMultiKueue, *,
                           key: str) -> None:
    """Apply a manager's MultiKueue objects, then delete those of workers no longer listed
    (only what carries our managed-by label: a user's own Secrets stay)."""
    wanted = {(obj["kind"], obj["metadata"]["name"]) for obj in action.objects}
    for obj in action.objects:
        await _apply(client, obj)
    selector = {"labelSelector": ",".join(f"{k}={v}" for k, v in planning.MANAGED_BY.items())}
    for kind, collection in (
            ("MultiKueueCluster", MULTIKUEUE_CLUSTERS),
            ("Secret", f"/api/v1/namespaces/{rendering.NAMESPACE}/secrets")):
        for item in (await client.get(collection, selector)).get("items") or []:
            name = item["metadata"]["name"]
            if (kind, name) not in wanted:
                logger.info("cluster %s: kueue: deleting %s %s (no longer a worker)", key,
                            kind, name)
                with contextlib.suppress(NotFound):
                    await client.delete(f"{collection}/{name}")


async def _observe_workers(runtime: Runtime, cluster: FakeCluster,
                           key: str) -> tuple[planning.Worker, ...]:
    namespace = cluster.metadata["namespace"]
    activity: dict[str, tuple[bool, str]] = {}
    local = runtime.substrate.clusters.get(key)
    if local is not None and key in runtime.kueue.hooked:
        with contextlib.suppress(K8sError):
            async with _member(local) as client:
                for item in (await client.get(MULTIKUEUE_CLUSTERS)).get("items") or []:
                    for found in (item.get("status") or {}).get("conditions") or []:
                        if found["type"] == "Active":
                            activity[item["metadata"]["name"]] = (
                                found["status"] == "True", found.get("reason", ""))
    workers = []
    for name in planning.worker_names(cluster):
        try:
            worker = FakeCluster.model_validate(await runtime.host.get(
                CLUSTERS.format(namespace=namespace, name=name)))
        except NotFound:
            workers.append(planning.Worker(name))
            continue
        active, reason = activity.get(name, (None, ""))
        workers.append(planning.Worker(
            name, exists=True, kueue=worker.spec.kueue is not None,
            kubeconfig=await _kubeconfig_of(runtime, worker), active=active,
            inactive_reason=reason))
    return tuple(workers)


async def _kubeconfig_of(runtime: Runtime, worker: FakeCluster) -> str:
    """The worker's kubeconfig from its Secret on the host ("" until there is one)."""
    name = worker.status.kubeconfigSecret if worker.status else ""
    if not name:
        return ""
    try:
        secret = await runtime.host.get(
            f"/api/v1/namespaces/{worker.metadata['namespace']}/secrets/{name}")
    except NotFound:
        return ""
    data = (secret.get("data") or {}).get("kubeconfig")
    return base64.b64decode(data).decode() if data else ""


def components(runtime: Runtime) -> list[ComponentState]:
    """Each member's Kueue, as ``fakefleet status`` lists it (probed at its readiness URL)."""
    found = []
    for key, process in runtime.kueue.processes.items():
        files = _files(runtime, key)
        ports = _stored_ports(files)
        if ports is None:
            continue
        found.append(ComponentState(
            cluster=key, name="kueue", pid=process.pid, port=ports.webhook,
            healthUrl=f"http://127.0.0.1:{ports.health}/readyz", log=str(files.log),
            restarts=process.restarts))
    return found


def _files(runtime: Runtime, key: str) -> KueueFiles:
    return StateDir(runtime.state_dir).kueue(key)


def _ports(files: KueueFiles) -> rendering.KueuePorts:
    """The ports Kueue had before (webhooks already point there), else free ones."""
    if files.ports.exists():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return _read_ports(files)
    ports = rendering.KueuePorts(webhook=free_port(), health=free_port(), metrics=free_port())
    write_private(files.ports, (json.dumps(ports.__dict__, indent=2) + "\n").encode())
    return ports


def _stored_ports(files: KueueFiles) -> rendering.KueuePorts | None:
    try:
        return _read_ports(files)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _read_ports(files: KueueFiles) -> rendering.KueuePorts:
    return rendering.KueuePorts(**json.loads(files.ports.read_text()))


def _ensure_metrics_cert() -> None:
    try:
        ensure_serving_pair(METRICS_CERT_DIR / "tls.crt", METRICS_CERT_DIR / "tls.key",
                            "kueue-metrics")
    except PermissionError as error:
        raise AddonError(
            f"Kueue {KUEUE_VERSION} reads its metrics certificate from the fixed path "
            f"{METRICS_CERT_DIR} (tls.crt, tls.key) and this user cannot write there "
            f"({error}): run once 'sudo install -d -o $USER {METRICS_CERT_DIR}'") from error


async def _manifests(runtime: Runtime) -> source.Manifests:
    if runtime.kueue.manifests is None:
        directory = await asyncio.to_thread(source.module_dir)
        runtime.kueue.manifests = await asyncio.to_thread(source.load, directory)
    return runtime.kueue.manifests


def _member(local: LocalCluster) -> Client:
    return Client.connect(load_kubeconfig_file(local.kubeconfig_path), connections=4,
                          timeout=30)


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    path = f"{collection_path(obj, PLURALS[obj['kind']])}/{obj['metadata']['name']}"
    return await client.server_side_apply(path, obj, field_manager=rendering.FIELD_MANAGER)


async def _wait_established(client: Client, names: list[str]) -> None:
    deadline = time.monotonic() + ESTABLISHED_TIMEOUT
    for name in names:
        while True:
            current = await client.get(f"{CRDS}/{name}")
            conditions = (current.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise AddonError(f"Kueue's CRD {name} was not Established after "
                                 f"{ESTABLISHED_TIMEOUT:.0f}s")
            await asyncio.sleep(0.2)
