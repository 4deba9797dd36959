"""metrics-server on a member, as the add-on runner (:mod:`operators.addons.running`) drives it.

metrics-server is started when the cluster's spec wants it (by default, for a local control
plane): upstream's RBAC is applied to the member, its certificates (a CA of its own, a serving
certificate for the name the aggregation layer verifies) and kubeconfig written to
``<state>/clusters/<key>/metrics-server/``; once it answers ``/livez``, its Service and
APIService are applied, so the aggregation layer routes metrics.k8s.io to it; when it is
disabled, they are deleted. What to do is decided in
:mod:`operators.addons.metricsserver.planning`; this module observes and acts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Never, assert_never

from operators.addons.building import Fetched
from operators.addons.lifecycle import Observed, Step
from operators.addons.metricsserver import TOOL, planning, rendering, source
from operators.addons.running import Files, Instance, Launch, Site, apply, owner
from operators.api.clusters import FakeCluster
from operators.controlplane import health, kubeconfigs
from operators.controlplane.pki import ensure_addon_pki
from operators.controlplane.ports import free_port
from operators.controlplane.state import StateDir, choose_engine_endpoint
from operators.controlplane.supervising import tail
from operators.k8s import owning
from operators.k8s.client import Client
from operators.reconciling.clusters import AddonState
from primitives.files import private_directory, write_private

PLURALS = {
    "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles", "RoleBinding": "rolebindings", "Service": "services",
    "APIService": "apiservices",
}
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"
#: metrics-server as the writer of its objects in the member (it never touches another's).
OWNER = owner("metrics-server", rendering.FIELD_MANAGER)


class MetricsServerFiles(Files):
    """A member's metrics-server: its port besides what every add-on has."""

    @property
    def port(self) -> Path:
        return self.directory / "port"


class MetricsServer:
    """The metrics-server add-on (an :class:`~operators.addons.running.Addon`)."""

    name = "metrics-server"
    tool = TOOL
    condition = planning.CONDITION
    hooks = "APIService"

    def __init__(self) -> None:
        #: Its RBAC and APIService from its module source.
        self.manifests = Fetched(lambda: source.load(source.module_dir()))

    def wanted(self, cluster: FakeCluster) -> bool:
        return cluster.spec.metrics_server is not None

    def files(self, state: StateDir, key: str) -> MetricsServerFiles:
        return MetricsServerFiles.of(state, key, self.name)

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> planning.Observed:
        files = self.files(site.state, site.key)
        port = _stored_port(files)
        live = ready = False
        if instance is not None and instance.process.running and port:
            live, _ = await health.probe(f"https://127.0.0.1:{port}/livez",
                                         health.insecure_tls())
            if live:
                ready, _ = await health.probe(f"https://127.0.0.1:{port}/readyz",
                                              health.insecure_tls())
        return planning.Observed(**{
            **lifecycle.__dict__,
            "live": live,
            "ready": ready,
            "log_tail": tail(files.log, 200) if instance is not None and not live else "",
            "port": port,
            "resolution": instance.settings if instance is not None else "",
        })

    def plan(self, cluster: FakeCluster, observed: planning.Observed) -> Sequence[Step]:
        return planning.plan(cluster, observed)

    def state(self, cluster: FakeCluster, observed: planning.Observed) -> AddonState | None:
        return planning.condition(cluster, observed)

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        """Its RBAC in the member, its certificates and kubeconfig on disk."""
        local = site.control_plane()
        spec = cluster.spec.metrics_server
        assert spec is not None, "plan() starts metrics-server only when it is wanted"
        manifests = await self.manifests.get()
        files = self.files(site.state, site.key)
        private_directory(files.directory)
        port = _port(files)
        pki = await asyncio.to_thread(
            ensure_addon_pki, files.pki, local.pki, rendering.USER,
            ca_name="fakefleet-metrics-server-ca", serving_name=rendering.SERVICE_HOST,
            hosts=(rendering.SERVICE_HOST, "localhost", "127.0.0.1"))
        write_private(files.kubeconfig, kubeconfigs.render(
            cluster=site.key, server=local.endpoint, ca_cert=local.pki.ca_cert,
            client_cert=pki.client_cert, client_key=pki.client_key,
            user="metrics-server").encode())
        async with site.connect() as client:
            for obj in rendering.rbac(manifests):
                await _apply(client, obj)
        # The engine's port, chosen here if the engine has not started yet: either takes
        # what the other wrote down.
        engine = choose_engine_endpoint(site.state, site.key)
        return Launch(rendering.argv(binary, kubeconfig=files.kubeconfig, port=port,
                                     cert=pki.serving_cert, key=pki.serving_key,
                                     resolution=spec.resolution,
                                     kubelet_port=engine.kubeletPort),
                      settings=spec.resolution)

    async def hook(self, site: Site) -> None:
        """Route metrics.k8s.io to the running metrics-server."""
        files = self.files(site.state, site.key)
        manifests = await self.manifests.get()
        port = _stored_port(files)
        async with site.connect() as client:
            await _apply(client, rendering.service(port))
            await _apply(client, rendering.apiservice(
                manifests, port=port, ca_pem=(files.pki / "ca.crt").read_bytes()))

    async def unhook(self, site: Site) -> None:
        async with site.connect() as client:
            await owning.delete(client, f"{APISERVICES}/{rendering.APISERVICE}", owner=OWNER)
            await owning.delete(client, f"/api/v1/namespaces/{rendering.NAMESPACE}/services/"
                                        f"{rendering.SERVICE}", owner=OWNER)

    async def act(self, site: Site, cluster: FakeCluster, action: Never,
                  instance: Instance) -> None:
        assert_never(action)  # its plan has only the lifecycle's steps

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        port = _stored_port(self.files(state, key))
        return (port, f"https://127.0.0.1:{port}/livez") if port else None


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


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    return await apply(client, obj, plurals=PLURALS, field_manager=rendering.FIELD_MANAGER,
                       owner=OWNER)
