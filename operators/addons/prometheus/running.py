"""Prometheus on a member, as the add-on runner (:mod:`operators.addons.running`) drives it.

Prometheus is started when ``spec.addons.customMetrics`` asks for it and the member's engine
has its plain port: its RBAC is applied to the member, its client certificate (issued by the
member's CA) and kubeconfig, its configuration and its port written to
``<state>/clusters/<key>/prometheus/``, its TSDB kept in ``data/`` there. It has nothing to
hook: nothing in the member calls it (the custom-metrics adapter does, from this host). What to
do is decided in :mod:`operators.addons.prometheus.planning`; this module observes and acts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Never, assert_never

import yaml

from operators.addons.lifecycle import Observed, Step
from operators.addons.prometheus import TOOL, planning, rendering
from operators.addons.running import Files, Instance, Launch, Site, apply
from operators.api.clusters import FakeCluster
from operators.api.durations import parse_duration
from operators.controlplane import health, kubeconfigs
from operators.controlplane.pki import ensure_client_pki
from operators.controlplane.ports import free_port
from operators.controlplane.state import StateDir, read_engine_endpoint
from operators.controlplane.supervising import tail
from operators.k8s import owning
from operators.k8s.client import Client
from operators.reconciling.clusters import AddonState
from primitives.files import private_directory, write_private

PLURALS = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}
#: Prometheus as the writer of its objects in the member (it never touches another's).
#: Younger than the ownership marker: what carries none is not its own, whatever its labels.
OWNER = owning.Owner("Addon/prometheus")


class PrometheusFiles(Files):
    """A member's Prometheus: its port, configuration and TSDB besides what every add-on
    has."""

    @property
    def port(self) -> Path:
        return self.directory / "port"

    @property
    def config(self) -> Path:
        return self.directory / "prometheus.yml"

    @property
    def data(self) -> Path:
        return self.directory / "data"


class Prometheus:
    """The Prometheus add-on (an :class:`~operators.addons.running.Addon`)."""

    name = "prometheus"
    tool = TOOL
    condition = planning.CONDITION
    hooks = "nothing (nothing in the cluster calls it)"

    def wanted(self, cluster: FakeCluster) -> bool:
        return cluster.spec.custom_metrics is not None

    def files(self, state: StateDir, key: str) -> PrometheusFiles:
        return PrometheusFiles.of(state, key, self.name)

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> planning.Observed:
        files = self.files(site.state, site.key)
        port = stored_port(files.port)
        ready = False
        if instance is not None and instance.process.running and port:
            ready, _ = await health.probe(f"http://127.0.0.1:{port}/-/ready")
        engine = read_engine_endpoint(site.state, site.key)
        return planning.Observed(**{
            **lifecycle.__dict__,
            "ready": ready,
            "log_tail": tail(files.log, 200) if instance is not None and not ready else "",
            "port": port,
            "engine_port": engine.kubeletPort if engine is not None else 0,
            "settings": instance.settings if instance is not None else "",
        })

    def plan(self, cluster: FakeCluster, observed: planning.Observed) -> Sequence[Step]:
        return planning.plan(cluster, observed)

    def state(self, cluster: FakeCluster, observed: planning.Observed) -> AddonState | None:
        return planning.condition(cluster, observed)

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        """Its RBAC in the member; its certificate, kubeconfig and configuration on disk."""
        local = site.control_plane()
        spec = cluster.spec.custom_metrics
        assert spec is not None, "plan() starts Prometheus only when it is asked for"
        engine = read_engine_endpoint(site.state, site.key)
        assert engine is not None, "plan() starts Prometheus only once the engine has a port"
        files = self.files(site.state, site.key)
        private_directory(files.directory)
        port = ensure_port(files.port)
        pki = await asyncio.to_thread(ensure_client_pki, files.pki, local.pki, rendering.USER)
        write_private(files.kubeconfig, kubeconfigs.render(
            cluster=site.key, server=local.endpoint, ca_cert=local.pki.ca_cert,
            client_cert=pki.client_cert, client_key=pki.client_key,
            user="prometheus").encode())
        write_private(files.config, yaml.safe_dump(rendering.config(
            kubeconfig=files.kubeconfig, engine_port=engine.kubeletPort,
            scrape_interval=parse_duration(spec.scrapeInterval),
            retention=parse_duration(spec.retention), metrics=spec.metrics),
            sort_keys=False).encode())
        async with site.connect() as client:
            for obj in rendering.rbac():
                await _apply(client, obj)
        return Launch(rendering.argv(binary, config=files.config, data=files.data, port=port),
                      settings=planning.settings(spec, engine.kubeletPort))

    async def hook(self, site: Site) -> None:
        """Nothing in the member calls Prometheus."""

    async def unhook(self, site: Site) -> None:
        """Nothing points at it (its role stays, as metrics-server's does)."""

    async def act(self, site: Site, cluster: FakeCluster, action: Never,
                  instance: Instance) -> None:
        assert_never(action)  # its plan has only the lifecycle's steps

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        port = stored_port(self.files(state, key).port)
        return (port, f"http://127.0.0.1:{port}/-/ready") if port else None


def ensure_port(path: Path) -> int:
    """The port kept in ``path`` (what points at it stays right), else a free one, kept."""
    port = stored_port(path)
    if port:
        return port
    port = free_port()
    write_private(path, f"{port}\n".encode())
    return port


def stored_port(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    return await apply(client, obj, plurals=PLURALS, field_manager=rendering.FIELD_MANAGER,
                       owner=OWNER)
