"""Taking a member's inventory for the hub: its pools' nodes (as the engines wrote the
FakeNodePools' status in the host) and its pods by phase (from the member's own API server),
each refreshed at its own pace, and sent with a heartbeat only when it changed.

Listing every pod is the one expensive read of the hub link, so pods are counted rarely
(:data:`PODS_EVERY`), from the API server's watch cache. What an inventory holds is
:func:`operators.hublink.convert.inventory` (pure); this module only reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from federation.api import common_pb2
from operators.api.base import API_VERSION
from operators.api.nodepools import FakeNodePool
from operators.hublink import convert
from operators.k8s.client import Client

POOLS = f"/apis/{API_VERSION}/namespaces/{{namespace}}/fakenodepools"
#: How often pools are looked at for node counts (s).
POOLS_EVERY = 5.0
#: How often the member's pods are counted by phase (a list of every pod) (s).
PODS_EVERY = 30.0


class Inventorying:
    """One member's inventory, as last read."""

    def __init__(self, host: Client, namespace: str, name: str, *,
                 member_client: Callable[[], Client | None]) -> None:
        self.host = host
        self.namespace = namespace
        self.name = name
        self._member_client = member_client
        self.inventory = common_pb2.Inventory()
        self._sent: bytes = b""
        self._pods: dict[str, int] = {}
        self._pools_at = self._pods_at = 0.0

    def changed(self) -> common_pb2.Inventory | None:
        """The inventory, if it changed since it was last asked for (else None)."""
        encoded = self.inventory.SerializeToString(deterministic=True)
        if encoded == self._sent:
            return None
        self._sent = encoded
        return self.inventory

    def resend(self) -> None:
        """A new session: the hub gets the inventory again."""
        self._sent = b""

    async def refresh(self, now: float) -> None:
        """Read what is due: the pods every PODS_EVERY, the pools every POOLS_EVERY."""
        if now >= self._pods_at:
            await self.refresh_pods()
            self._pods_at = now + PODS_EVERY
        if now >= self._pools_at:
            await self.refresh_pools()
            self._pools_at = now + POOLS_EVERY

    async def refresh_pools(self) -> None:
        listed = await self.host.get(POOLS.format(namespace=self.namespace))
        pools = [FakeNodePool.model_validate(item) for item in listed.get("items", [])
                 if (item.get("spec") or {}).get("clusterRef") == self.name]
        self.inventory = convert.inventory(pools, self._pods)

    async def refresh_pods(self) -> None:
        client = self._member_client()
        if client is None:
            return
        # From the API server's watch cache (resourceVersion=0): no etcd read for it.
        listed: dict[str, Any] = await client.get("/api/v1/pods", {"resourceVersion": "0"})
        self._pods = convert.count_phases(listed.get("items", []))
