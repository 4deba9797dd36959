"""Karpenter on a member, as the add-on runner (:mod:`operators.addons.running`) drives it.

Karpenter is started when ``spec.addons.karpenter`` asks for it: its CRDs are applied to the
member (and waited for: its readiness checks that NodePool and NodeClaim are served), its ports
and instance types written to ``<state>/clusters/<key>/karpenter/``, and it runs with the
member's admin kubeconfig. Once it answers ``/readyz`` it gets a NodePool and a KWOKNodeClass
for each FakeNodePool of the cluster with ``provisioner: karpenter`` (read from the host), and
those of pools that are gone are deleted. What to do is decided in
:mod:`operators.addons.karpenter.planning`; this module observes and acts.

It has nothing to hook: no webhook, no APIService, nothing in the member calls it. When it is
disabled, what it made stays: deleting its NodePools while it is stopped would leave NodeClaims
and nodes whose finalizers only it removes.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from operators.addons.building import Fetched
from operators.addons.karpenter import TOOL, planning, rendering, source
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
from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.nodepools import FakeNodePool, FakeNodePoolSpec
from operators.controlplane import health
from operators.controlplane.ports import free_port
from operators.controlplane.state import StateDir
from operators.controlplane.supervising import tail
from operators.k8s import owning
from operators.k8s.applying import wait_established
from operators.k8s.client import Client
from operators.k8s.errors import K8sError
from operators.reconciling.clusters import AddonState
from primitives.files import private_directory, write_private

logger = logging.getLogger(__name__)

ESTABLISHED_TIMEOUT = 30.0
PLURALS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "NodePool": "nodepools", "KWOKNodeClass": "kwoknodeclasses",
}
NODEPOOLS = f"/apis/{rendering.NODEPOOL_API}/nodepools"
NODECLASSES = f"/apis/{rendering.NODECLASS_API}/kwoknodeclasses"
POOLS = f"/apis/{API_VERSION}/namespaces/{{namespace}}/fakenodepools"
MANAGED = {"labelSelector": ",".join(f"{k}={v}" for k, v in rendering.MANAGED_BY.items())}
#: Karpenter as the writer of its objects in the member (it never touches another's). Younger
#: than the ownership marker: what carries none is not its own, whatever its labels.
OWNER = owning.Owner("Addon/karpenter")


class KarpenterFiles(Files):
    """A member's Karpenter: its instance types besides what every add-on has."""

    @property
    def instance_types(self) -> Path:
        return self.directory / "instance-types.json"


class Karpenter:
    """The Karpenter add-on (an :class:`~operators.addons.running.Addon`)."""

    name = "karpenter"
    tool = TOOL
    condition = planning.CONDITION
    hooks = "nothing (it has no webhooks)"

    def __init__(self) -> None:
        #: Its CRDs from its module source.
        self.manifests = Fetched(lambda: source.load(source.module_dir()))

    def wanted(self, cluster: FakeCluster) -> bool:
        return cluster.spec.karpenter is not None

    def files(self, state: StateDir, key: str) -> KarpenterFiles:
        return KarpenterFiles.of(state, key, self.name)

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> planning.Observed:
        files = self.files(site.state, site.key)
        ports = _stored_ports(files)
        ready = False
        if instance is not None and instance.process.running and ports is not None:
            ready, _ = await health.probe(f"http://127.0.0.1:{ports.health}/readyz")
        pools: dict[str, FakeNodePoolSpec] = {}
        nodepools: tuple[planning.NodePoolState, ...] = ()
        if ready and cluster.spec.karpenter is not None:
            pools = await _provisioner_pools(site.host, cluster)
            with contextlib.suppress(K8sError):  # unknown: everything is applied again
                async with site.connect() as client:
                    nodepools = await _nodepools(client)
        return planning.Observed(**{
            **lifecycle.__dict__,
            "ready": ready,
            "log_tail": tail(files.log, 200) if instance is not None and not ready else "",
            "ports": ports,
            "settings": instance.settings if instance is not None else "",
            "pools": pools,
            "nodepools": nodepools,
            "applied": instance.applied if instance is not None else "",
        })

    def plan(self, cluster: FakeCluster, observed: planning.Observed) -> Sequence[
            Step | planning.ApplyNodePools]:
        return planning.plan(cluster, observed)

    def state(self, cluster: FakeCluster, observed: planning.Observed) -> AddonState | None:
        return planning.condition(cluster, observed)

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        """Its CRDs in the member, its ports and instance types on disk."""
        local = site.control_plane()
        spec = cluster.spec.karpenter
        assert spec is not None, "plan() starts Karpenter only when it is asked for"
        manifests = await self.manifests.get()
        files = self.files(site.state, site.key)
        private_directory(files.directory)
        ports = _ports(files)
        write_private(files.instance_types, (json.dumps(
            rendering.instance_types(spec.zones), indent=1) + "\n").encode())
        async with site.connect() as client:
            for crd in manifests.crds:
                await _apply(client, crd)
            await wait_established(client, [crd["metadata"]["name"] for crd in manifests.crds],
                                   timeout=ESTABLISHED_TIMEOUT)
        return Launch([str(binary)], settings=planning.settings(spec),
                      env=rendering.environment(kubeconfig=local.kubeconfig_path, ports=ports,
                                                instance_types=files.instance_types,
                                                node_repair=spec.nodeRepair))

    async def hook(self, site: Site) -> None:
        """Nothing calls Karpenter: its NodePools are applied as its own action."""

    async def unhook(self, site: Site) -> None:
        """Nothing to remove (see the module's docstring for why its NodePools stay)."""

    async def act(self, site: Site, cluster: FakeCluster, action: planning.ApplyNodePools,
                  instance: Instance) -> None:
        async with site.connect() as client:
            await apply_nodepools(client, action, key=site.key)
        instance.applied = action.fingerprint

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        """Its health port, probed at its readiness URL."""
        ports = _stored_ports(self.files(state, key))
        if ports is None:
            return None
        return ports.health, f"http://127.0.0.1:{ports.health}/readyz"


async def apply_nodepools(client: Client, action: planning.ApplyNodePools, *,
                          key: str) -> None:
    """Apply the provisioner pools' NodePools and KWOKNodeClasses, then delete fakefleet's
    others (a user's own stay): Karpenter deletes the NodeClaims, hence the nodes, of a
    NodePool that goes."""
    for obj in action.objects:
        await _apply(client, obj)
    for collection, kind in ((NODEPOOLS, "NodePool"), (NODECLASSES, "KWOKNodeClass")):
        for item in (await client.get(collection, MANAGED)).get("items") or []:
            name = item["metadata"]["name"]
            if name not in action.keep and await owning.delete(
                    client, f"{collection}/{name}", owner=OWNER):
                logger.info("cluster %s: karpenter: deleted %s %s (its pool is gone)", key,
                            kind, name)


async def _provisioner_pools(host: Client, cluster: FakeCluster) -> dict[str, FakeNodePoolSpec]:
    """The cluster's FakeNodePools with provisioner karpenter, none being deleted."""
    listed = await host.get(POOLS.format(namespace=cluster.metadata["namespace"]),
                            {"fieldSelector": f"spec.clusterRef={cluster.metadata['name']}"})
    pools = {}
    for item in listed.get("items") or []:
        try:
            pool = FakeNodePool.model_validate(item)
        except ValidationError as error:  # the CRD's schema is the model's: should not happen
            logger.error("pool %s cannot be read, ignored: %s", item["metadata"]["name"], error)
            continue
        if pool.spec.provisioner == "karpenter" and not pool.metadata.get("deletionTimestamp"):
            pools[pool.metadata["name"]] = pool.spec
    return pools


async def _nodepools(client: Client) -> tuple[planning.NodePoolState, ...]:
    found = []
    for item in (await client.get(NODEPOOLS, MANAGED)).get("items") or []:
        if item["metadata"].get("deletionTimestamp") or not OWNER.owns(item):
            continue
        ready: dict[str, Any] = next(
            (c for c in (item.get("status") or {}).get("conditions") or ()
             if c.get("type") == "Ready"), {})
        found.append(planning.NodePoolState(item["metadata"]["name"],
                                            ready=ready.get("status") == "True",
                                            message=ready.get("message", "")))
    return tuple(found)


def _ports(files: KarpenterFiles) -> rendering.KarpenterPorts:
    """The ports it had before, else free ones."""
    return kept_ports(files, rendering.KarpenterPorts, lambda: rendering.KarpenterPorts(
        metrics=free_port(), health=free_port()))


def _stored_ports(files: Files) -> rendering.KarpenterPorts | None:
    return stored_ports(files, rendering.KarpenterPorts)


async def _apply(client: Client, obj: dict[str, Any]) -> Any:
    return await apply(client, obj, plurals=PLURALS, field_manager=rendering.FIELD_MANAGER,
                       owner=OWNER)
