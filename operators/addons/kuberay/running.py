"""KubeRay on a member, as the add-on runner (:mod:`operators.addons.running`) drives it.

KubeRay is started when ``spec.addons.kuberay`` asks for it: its CRDs (waited for until
Established) and RBAC are applied to the member, its serving certificate (under a CA of its
own, from fakefleet's PKI: no cert-manager), client certificate and kubeconfig written to
``<state>/clusters/<key>/kuberay/``; once its ``/readyz`` answers (its webhook server included),
its validating webhook configuration is applied; when the add-on goes, it is deleted, and its
CRDs and the user's RayClusters stay. What to do is decided in
:mod:`operators.addons.kuberay.planning`; this module observes and acts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Never, assert_never

from operators.addons.building import Fetched
from operators.addons.kuberay import TOOL, planning, rendering, source
from operators.addons.lifecycle import Observed, Step
from operators.addons.running import (
    Files,
    Instance,
    Launch,
    Site,
    apply,
    kept_ports,
    stored_ports,
)
from operators.api.clusters import FakeCluster
from operators.controlplane import health, kubeconfigs
from operators.controlplane.pki import ensure_addon_pki
from operators.controlplane.ports import free_port
from operators.controlplane.state import StateDir
from operators.controlplane.supervising import tail
from operators.k8s import owning
from operators.k8s.applying import wait_established
from operators.k8s.client import Client
from operators.reconciling.clusters import AddonState
from primitives.files import private_directory, write_private

#: Its three CRDs are 3 MB of schema: the API server takes a while to establish them.
ESTABLISHED_TIMEOUT = 60.0
PLURALS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
    "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
}
#: KubeRay as the writer of its objects in the member (it never touches another's). Younger
#: than the ownership marker: what carries none is not its own, whatever its labels.
OWNER = owning.Owner("Addon/kuberay")


class KubeRay:
    """The KubeRay add-on (an :class:`~operators.addons.running.Addon`)."""

    name = "kuberay"
    tool = TOOL
    condition = planning.CONDITION
    hooks = "webhook"

    def __init__(self) -> None:
        #: KubeRay's manifests from its module source.
        self.manifests = Fetched(lambda: source.load(source.module_dir()))

    def wanted(self, cluster: FakeCluster) -> bool:
        return cluster.spec.kuberay is not None

    def files(self, state: StateDir, key: str) -> Files:
        return Files.of(state, key, self.name)

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> planning.Observed:
        files = self.files(site.state, site.key)
        ports = _stored_ports(files)
        ready = False
        if instance is not None and instance.process.running and ports is not None:
            ready, _ = await health.probe(f"http://127.0.0.1:{ports.health}/readyz")
        return planning.Observed(**{
            **lifecycle.__dict__,
            "ready": ready,
            "log_tail": tail(files.log, 200) if instance is not None and not ready else "",
            "ports": ports,
        })

    def plan(self, cluster: FakeCluster, observed: planning.Observed) -> Sequence[Step]:
        return planning.plan(cluster, observed)

    def state(self, cluster: FakeCluster, observed: planning.Observed) -> AddonState | None:
        return planning.condition(cluster, observed)

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        """CRDs and RBAC in the member, certificates and kubeconfig on disk."""
        local = site.control_plane()
        manifests = await self.manifests.get()
        files = self.files(site.state, site.key)
        private_directory(files.directory)
        ports = _ports(files)
        pki = await asyncio.to_thread(
            ensure_addon_pki, files.pki, local.pki, rendering.USER,
            ca_name="fakefleet-kuberay-webhook-ca", serving_name="kuberay-webhook",
            hosts=("localhost", "127.0.0.1"))
        write_private(files.kubeconfig, kubeconfigs.render(
            cluster=site.key, server=local.endpoint, ca_cert=local.pki.ca_cert,
            client_cert=pki.client_cert, client_key=pki.client_key, user="kuberay").encode())
        async with site.connect() as client:
            crds = rendering.crds(manifests)
            for crd in crds:
                await _apply(client, crd)
            await wait_established(client, [crd["metadata"]["name"] for crd in crds],
                                   timeout=ESTABLISHED_TIMEOUT)
            for obj in rendering.rbac(manifests):
                await _apply(client, obj)
        return Launch(rendering.argv(binary, ports=ports, cert_dir=files.pki),
                      env=rendering.environment(kubeconfig=files.kubeconfig))

    async def hook(self, site: Site) -> None:
        """Point the member's RayCluster webhook at the running KubeRay."""
        files = self.files(site.state, site.key)
        manifests = await self.manifests.get()
        ca_pem = (files.pki / "ca.crt").read_bytes()
        port = _read_ports(files).webhook
        async with site.connect() as client:
            for configuration in rendering.webhook_configurations(manifests, port=port,
                                                                   ca_pem=ca_pem):
                await _apply(client, configuration)

    async def unhook(self, site: Site) -> None:
        manifests = await self.manifests.get()
        async with site.connect() as client:
            for plural, name in rendering.webhook_configuration_names(manifests):
                await owning.delete(
                    client, f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}", owner=OWNER)

    async def act(self, site: Site, cluster: FakeCluster, action: Never,
                  instance: Instance) -> None:
        assert_never(action)  # its plan has only the lifecycle's steps

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        """Its webhook port, probed at its readiness URL."""
        ports = _stored_ports(self.files(state, key))
        if ports is None:
            return None
        return ports.webhook, f"http://127.0.0.1:{ports.health}/readyz"


def _ports(files: Files) -> rendering.KubeRayPorts:
    """The ports KubeRay had before (its webhook already points there), else free ones."""
    return kept_ports(files, rendering.KubeRayPorts, lambda: rendering.KubeRayPorts(
        webhook=free_port(), health=free_port(), metrics=free_port()))


def _stored_ports(files: Files) -> rendering.KubeRayPorts | None:
    return stored_ports(files, rendering.KubeRayPorts)


def _read_ports(files: Files) -> rendering.KubeRayPorts:
    return rendering.KubeRayPorts(**json.loads(files.ports.read_text()))


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    return await apply(client, obj, plurals=PLURALS, field_manager=rendering.FIELD_MANAGER,
                       owner=OWNER)
