"""The custom-metrics adapter on a member, as the add-on runner (:mod:`operators.addons.running`)
drives it.

The adapter is started when ``spec.addons.customMetrics`` asks for it and the member's
Prometheus has its port: its RBAC is applied to the member, its certificates (a CA of its own,
a serving certificate for the name the aggregation layer verifies, a client certificate from
the member's CA) and kubeconfig written to ``<state>/clusters/<key>/custom-metrics-adapter/``;
once it answers ``/readyz``, its Service and APIServices are applied, so the aggregation layer
routes custom.metrics.k8s.io to it; when it is disabled, they are deleted. What to do is
decided in :mod:`operators.addons.custommetrics.planning`; this module observes and acts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Never, assert_never

from operators.addons.custommetrics import TOOL, planning, rendering
from operators.addons.lifecycle import Observed, Step
from operators.addons.prometheus.running import (
    Prometheus,
    PrometheusFiles,
    ensure_port,
    stored_port,
)
from operators.addons.running import Files, Instance, Launch, Site, apply
from operators.api.clusters import FakeCluster
from operators.controlplane import health, kubeconfigs
from operators.controlplane.pki import ensure_addon_pki
from operators.controlplane.state import StateDir
from operators.controlplane.supervising import tail
from operators.k8s import owning
from operators.k8s.client import Client
from operators.reconciling.clusters import AddonState
from primitives.files import private_directory, write_private

PLURALS = {
    "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
    "RoleBinding": "rolebindings", "Service": "services", "APIService": "apiservices",
}
APISERVICES = "/apis/apiregistration.k8s.io/v1/apiservices"
#: The adapter as the writer of its objects in the member (it never touches another's).
#: Younger than the ownership marker: what carries none is not its own, whatever its labels.
OWNER = owning.Owner("Addon/custom-metrics-adapter")


class AdapterFiles(Files):
    """A member's adapter: its port besides what every add-on has."""

    @property
    def port(self) -> Path:
        return self.directory / "port"


class CustomMetricsAdapter:
    """The custom-metrics adapter add-on (an :class:`~operators.addons.running.Addon`)."""

    name = "custom-metrics-adapter"
    tool = TOOL
    condition = planning.CONDITION
    hooks = "APIServices"

    def wanted(self, cluster: FakeCluster) -> bool:
        return cluster.spec.custom_metrics is not None

    def files(self, state: StateDir, key: str) -> AdapterFiles:
        return AdapterFiles.of(state, key, self.name)

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> planning.Observed:
        files = self.files(site.state, site.key)
        port = stored_port(files.port)
        ready = False
        if instance is not None and instance.process.running and port:
            ready, _ = await health.probe(f"https://127.0.0.1:{port}/readyz",
                                          health.insecure_tls())
        return planning.Observed(**{
            **lifecycle.__dict__,
            "ready": ready,
            "log_tail": tail(files.log, 200) if instance is not None and not ready else "",
            "port": port,
            "prometheus": stored_port(_prometheus(site).port),
            "settings": instance.settings if instance is not None else "",
        })

    def plan(self, cluster: FakeCluster, observed: planning.Observed) -> Sequence[Step]:
        return planning.plan(cluster, observed)

    def state(self, cluster: FakeCluster, observed: planning.Observed) -> AddonState | None:
        return planning.condition(cluster, observed)

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        """Its RBAC in the member, its certificates and kubeconfig on disk."""
        local = site.control_plane()
        spec = cluster.spec.custom_metrics
        assert spec is not None, "plan() starts the adapter only when it is asked for"
        prometheus = stored_port(_prometheus(site).port)
        assert prometheus, "plan() starts the adapter only once Prometheus has a port"
        files = self.files(site.state, site.key)
        private_directory(files.directory)
        port = ensure_port(files.port)
        pki = await asyncio.to_thread(
            ensure_addon_pki, files.pki, local.pki, rendering.USER,
            ca_name="fakefleet-custom-metrics-ca", serving_name=rendering.SERVICE_HOST,
            hosts=(rendering.SERVICE_HOST, "localhost", "127.0.0.1"))
        write_private(files.kubeconfig, kubeconfigs.render(
            cluster=site.key, server=local.endpoint, ca_cert=local.pki.ca_cert,
            client_cert=pki.client_cert, client_key=pki.client_key,
            user="custom-metrics-adapter").encode())
        async with site.connect() as client:
            for obj in rendering.rbac():
                await _apply(client, obj)
        return Launch(rendering.argv(binary, kubeconfig=files.kubeconfig, port=port,
                                     cert=pki.serving_cert, key=pki.serving_key,
                                     prometheus=prometheus, metrics=spec.metrics),
                      settings=planning.settings(spec, prometheus))

    async def hook(self, site: Site) -> None:
        """Route custom.metrics.k8s.io to the running adapter."""
        files = self.files(site.state, site.key)
        port = stored_port(files.port)
        async with site.connect() as client:
            await _apply(client, rendering.service(port))
            for apiservice in rendering.apiservices(
                    port=port, ca_pem=(files.pki / "ca.crt").read_bytes()):
                await _apply(client, apiservice)

    async def unhook(self, site: Site) -> None:
        async with site.connect() as client:
            for name in rendering.APISERVICES:
                await owning.delete(client, f"{APISERVICES}/{name}", owner=OWNER)
            await owning.delete(client, f"/api/v1/namespaces/{rendering.NAMESPACE}/services/"
                                        f"{rendering.SERVICE}", owner=OWNER)

    async def act(self, site: Site, cluster: FakeCluster, action: Never,
                  instance: Instance) -> None:
        assert_never(action)  # its plan has only the lifecycle's steps

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        port = stored_port(self.files(state, key).port)
        return (port, f"https://127.0.0.1:{port}/readyz") if port else None


def _prometheus(site: Site) -> PrometheusFiles:
    return PrometheusFiles.of(site.state, site.key, Prometheus.name)


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    return await apply(client, obj, plurals=PLURALS, field_manager=rendering.FIELD_MANAGER,
                       owner=OWNER)
