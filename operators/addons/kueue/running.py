"""Kueue on a member, as the add-on runner (:mod:`operators.addons.running`) drives it.

Kueue is started when ``spec.addons.kueue`` asks for it: its CRDs (with their conversion
webhook), namespace and RBAC are applied to the member, its certificates and Configuration
written to ``<state>/clusters/<key>/kueue/``; once its readiness probe answers, its webhook
configurations are applied (their failure policy is Fail: applied before, they would refuse the
member's Jobs and Pods); when the add-on goes, its webhooks are deleted. On a MultiKueue manager
it also applies, and prunes, the Secrets and MultiKueueClusters of its workers, whose
FakeClusters and kubeconfig Secrets it reads on the host. What to do is decided in
:mod:`operators.addons.kueue.planning`; this module observes and acts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from operators.addons.building import Fetched
from operators.addons.kueue import KUEUE_VERSION, TOOL, planning, rendering, source
from operators.addons.lifecycle import Observed, Step
from operators.addons.running import Files, Instance, Launch, Site, apply, owner
from operators.api.clusters import FakeCluster
from operators.controlplane import health, kubeconfigs
from operators.controlplane.errors import AddonError
from operators.controlplane.pki import ensure_addon_pki, ensure_serving_pair
from operators.controlplane.ports import free_port
from operators.controlplane.state import StateDir
from operators.controlplane.supervising import tail
from operators.k8s import owning
from operators.k8s.applying import wait_established
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.reconciling.clusters import AddonState
from primitives.files import private_directory, write_private

logger = logging.getLogger(__name__)

#: Kueue v0.17 reads its metrics serving certificate from this fixed path whenever its internal
#: cert management is off (cmd/kueue/main.go); nothing verifies it, so one self-signed pair
#: serves every Kueue on the host.
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")
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
#: Kueue as the writer of its objects in the member (it never touches another's).
OWNER = owner("kueue", rendering.FIELD_MANAGER)


class KueueFiles(Files):
    """A member's Kueue: its Configuration and ports besides what every add-on has."""

    @property
    def config(self) -> Path:
        return self.directory / "config.yaml"

    @property
    def ports(self) -> Path:
        return self.directory / "ports.json"


class Kueue:
    """The Kueue add-on (an :class:`~operators.addons.running.Addon`)."""

    name = "kueue"
    tool = TOOL
    condition = planning.CONDITION
    hooks = "webhooks"

    def __init__(self) -> None:
        #: Kueue's manifests from its module source.
        self.manifests = Fetched(lambda: source.load(source.module_dir()))

    def wanted(self, cluster: FakeCluster) -> bool:
        return cluster.spec.kueue is not None

    def files(self, state: StateDir, key: str) -> KueueFiles:
        return KueueFiles.of(state, key, self.name)

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> planning.Observed:
        files = self.files(site.state, site.key)
        ready = False
        ports = _stored_ports(files)
        if instance is not None and instance.process.running and ports is not None:
            ready, _ = await health.probe(f"http://127.0.0.1:{ports.health}/readyz")
        workers: tuple[planning.Worker, ...] = ()
        if cluster.spec.kueue is not None and instance is not None \
                and lifecycle.control_plane_running:
            workers = await _observe_workers(site, cluster, hooked=instance.hooked)
        return planning.Observed(**{
            **lifecycle.__dict__,
            "ready": ready,
            "log_tail": tail(files.log, 200) if instance is not None and not ready else "",
            "webhook_port": ports.webhook if ports else 0,
            "workers": workers,
            "multikueue_applied": instance.applied if instance is not None else "",
        })

    def plan(self, cluster: FakeCluster, observed: planning.Observed) -> Sequence[
            Step | planning.ApplyMultiKueue]:
        return planning.plan(cluster, observed)

    def state(self, cluster: FakeCluster, observed: planning.Observed) -> AddonState | None:
        return planning.condition(cluster, observed)

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        """CRDs, namespace and RBAC in the member, certificates and Configuration on disk."""
        local = site.control_plane()
        manifests = await self.manifests.get()
        files = self.files(site.state, site.key)
        private_directory(files.directory)
        ports = _ports(files)
        pki = await asyncio.to_thread(
            ensure_addon_pki, files.pki, local.pki, rendering.USER,
            ca_name="fakefleet-kueue-webhook-ca", serving_name="kueue-webhook",
            hosts=("localhost", "127.0.0.1"))
        await asyncio.to_thread(_ensure_metrics_cert)
        spec = cluster.spec.kueue
        assert spec is not None, "plan() starts Kueue only when the add-on is asked for"
        multikueue = (rendering.MultiKueueSettings(spec.multiKueue.workerLostTimeout)
                      if spec.multiKueue is not None else None)
        write_private(files.config, yaml.safe_dump(
            rendering.configuration(ports, files.pki, multikueue), sort_keys=False).encode())
        write_private(files.kubeconfig, kubeconfigs.render(
            cluster=site.key, server=local.endpoint, ca_cert=local.pki.ca_cert,
            client_cert=pki.client_cert, client_key=pki.client_key, user="kueue").encode())
        async with site.connect() as client:
            await _apply(client, rendering.namespace())
            crds = rendering.crds(manifests, port=ports.webhook,
                                  ca_pem=pki.ca_cert.read_bytes())
            for crd in crds:
                await _apply(client, crd)
            await wait_established(client, [crd["metadata"]["name"] for crd in crds],
                                   timeout=ESTABLISHED_TIMEOUT)
            for obj in rendering.rbac(manifests):
                await _apply(client, obj)
        return Launch(rendering.argv(binary, config=files.config, kubeconfig=files.kubeconfig))

    async def hook(self, site: Site) -> None:
        """Point the member's webhooks (and CRD conversions) at the running Kueue."""
        files = self.files(site.state, site.key)
        manifests = await self.manifests.get()
        pki_ca = (files.pki / "ca.crt").read_bytes()
        port = _read_ports(files).webhook
        async with site.connect() as client:
            for configuration in rendering.webhook_configurations(manifests, port=port,
                                                                   ca_pem=pki_ca):
                await _apply(client, configuration)

    async def unhook(self, site: Site) -> None:
        manifests = await self.manifests.get()
        async with site.connect() as client:
            for plural, name in rendering.webhook_configuration_names(manifests):
                await owning.delete(
                    client, f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}", owner=OWNER)

    async def act(self, site: Site, cluster: FakeCluster, action: planning.ApplyMultiKueue,
                  instance: Instance) -> None:
        async with site.connect() as client:
            await apply_multikueue(client, action, key=site.key)
        instance.applied = action.fingerprint

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        """Its webhook port, probed at its readiness URL."""
        ports = _stored_ports(self.files(state, key))
        if ports is None:
            return None
        return ports.webhook, f"http://127.0.0.1:{ports.health}/readyz"


async def apply_multikueue(client: Client, action: planning.ApplyMultiKueue, *,
                           key: str) -> None:
    """Apply a manager's MultiKueue objects, then delete those of workers no longer listed
    (only Kueue's own: a user's Secrets and MultiKueueClusters stay)."""
    wanted = {(obj["kind"], obj["metadata"]["name"]) for obj in action.objects}
    for obj in action.objects:
        await _apply(client, obj)
    selector = {"labelSelector": ",".join(f"{k}={v}" for k, v in planning.MANAGED_BY.items())}
    for kind, collection in (
            ("MultiKueueCluster", MULTIKUEUE_CLUSTERS),
            ("Secret", f"/api/v1/namespaces/{rendering.NAMESPACE}/secrets")):
        for item in (await client.get(collection, selector)).get("items") or []:
            name = item["metadata"]["name"]
            if (kind, name) not in wanted and await owning.delete(
                    client, f"{collection}/{name}", owner=OWNER):
                logger.info("cluster %s: kueue: deleted %s %s (no longer a worker)", key,
                            kind, name)


async def _observe_workers(site: Site, cluster: FakeCluster, *,
                           hooked: bool) -> tuple[planning.Worker, ...]:
    namespace = cluster.metadata["namespace"]
    activity: dict[str, tuple[bool, str]] = {}
    if site.local is not None and hooked:
        with contextlib.suppress(K8sError):
            async with site.connect() as client:
                for item in (await client.get(MULTIKUEUE_CLUSTERS)).get("items") or []:
                    for found in (item.get("status") or {}).get("conditions") or []:
                        if found["type"] == "Active":
                            activity[item["metadata"]["name"]] = (
                                found["status"] == "True", found.get("reason", ""))
    workers = []
    for name in planning.worker_names(cluster):
        try:
            worker = FakeCluster.model_validate(await site.host.get(
                CLUSTERS.format(namespace=namespace, name=name)))
        except NotFound:
            workers.append(planning.Worker(name))
            continue
        active, reason = activity.get(name, (None, ""))
        workers.append(planning.Worker(
            name, exists=True, kueue=worker.spec.kueue is not None,
            kubeconfig=await _kubeconfig_of(site.host, worker), active=active,
            inactive_reason=reason))
    return tuple(workers)


async def _kubeconfig_of(host: Client, worker: FakeCluster) -> str:
    """The worker's kubeconfig from its Secret on the host ("" until there is one)."""
    name = worker.status.kubeconfigSecret if worker.status else ""
    if not name:
        return ""
    try:
        secret = await host.get(
            f"/api/v1/namespaces/{worker.metadata['namespace']}/secrets/{name}")
    except NotFound:
        return ""
    data = (secret.get("data") or {}).get("kubeconfig")
    return base64.b64decode(data).decode() if data else ""


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


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    return await apply(client, obj, plurals=PLURALS, field_manager=rendering.FIELD_MANAGER,
                       owner=OWNER)
