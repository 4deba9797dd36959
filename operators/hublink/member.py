"""The member a hub link speaks for: a FakeCluster, observed and acted on through the host API.

It implements :class:`federation.client.member.Member`. Everything it tells the hub comes from
what the API shows, never from memory alone: the Hello lists the FaultPlans of fleet runs that
exist for the cluster (so after an operator restart the hub still resends nothing that ran),
and a command is acknowledged once its FaultPlan exists (a delivery that finds it there is a
duplicate, executed once). A plan the API server refuses is reported Refused with its message.
Transient API errors are retried with back-off; the command waits, and the hub keeps it.

:meth:`HostMember.observe` runs beside the link: it reports each fleet FaultPlan whose result
changed, and refreshes the inventory (pools often, the member's pods more rarely: listing every
pod is the one expensive read here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from federation.api import common_pb2, member_pb2
from federation.client.member import LinkFaults
from operators.api.base import API_VERSION
from operators.api.clusters import CLUSTER_LABEL, FakeCluster
from operators.api.injections import hub_link_faults
from operators.api.nodepools import FakeNodePool
from operators.hublink import convert
from operators.k8s.client import Client
from operators.k8s.clock import SYSTEM_CLOCK, Clock
from operators.k8s.errors import BadRequest, Conflict, Invalid, K8sError, NotFound, transient
from operators.k8s.retrying import Backoff

logger = logging.getLogger(__name__)

BASE = f"/apis/{API_VERSION}/namespaces/{{namespace}}"
#: How often fleet FaultPlans are looked at for results, pools for node counts (s).
OBSERVE_EVERY = 1.0
POOLS_EVERY = 5.0
#: How often the member's pods are counted by phase (a list of every pod) (s).
PODS_EVERY = 30.0


class HostMember:
    def __init__(self, host: Client, namespace: str, name: str, *, host_id: str,
                 annotations: Callable[[], Mapping[str, str]],
                 member_client: Callable[[], Client | None] = lambda: None,
                 on_state: Callable[[bool, str], None] = lambda up, message: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.host = host
        self.namespace = namespace
        self.name = name
        self.host_id = host_id
        self._annotations = annotations
        self._member_client = member_client
        self._on_state = on_state
        self.clock = clock
        #: Where results go (the link's report, once it exists).
        self.report: Callable[[member_pb2.CommandResult], None] = lambda result: None
        self._inventory = common_pb2.Inventory()
        self._inventory_sent: bytes = b""
        self._pods: dict[str, int] = {}
        self._reported: dict[str, bytes] = {}
        #: Commands refused by the API server (nothing exists for them to observe).
        self._refused: dict[str, member_pb2.CommandResult] = {}

    @property
    def _plans(self) -> str:
        return BASE.format(namespace=self.namespace) + "/faultplans"

    @property
    def _selector(self) -> dict[str, str]:
        return {"labelSelector": f"{convert.RUN_LABEL},{CLUSTER_LABEL}={self.name}"}

    # -- what the link asks ---------------------------------------------------------------------

    async def introduce(self) -> member_pb2.RegisterRequest:
        cluster = FakeCluster.model_validate(await self.host.get(
            BASE.format(namespace=self.namespace) + f"/fakeclusters/{self.name}"))
        await self._refresh_pools()
        return convert.register_request(cluster, self.host_id, self._inventory)

    async def inventory(self) -> common_pb2.Inventory | None:
        encoded = self._inventory.SerializeToString(deterministic=True)
        if encoded == self._inventory_sent:
            return None
        self._inventory_sent = encoded
        return self._inventory

    async def resync(self) -> list[member_pb2.CommandResult]:
        self._inventory_sent = b""  # a new session: the hub gets the inventory again
        listed = await self.host.get(self._plans, self._selector)
        results = [r for plan in listed.get("items", []) if (r := convert.result(plan))]
        self._reported = {r.command_id: r.SerializeToString() for r in results}
        return results + list(self._refused.values())

    async def execute(self, command: member_pb2.Command) -> bool:
        backoff = Backoff(base=0.5, cap=10.0)
        while True:
            try:
                if command.WhichOneof("action") == "stop_plan":
                    return await self._stop(command)
                return await self._start(command)
            except K8sError as error:
                if not transient(error):
                    raise
                logger.warning("hub command %s in %s/%s: %s (retrying)", command.id,
                               self.namespace, self.name, error)
                await self.clock.sleep(backoff.next())

    async def _start(self, command: member_pb2.Command) -> bool:
        if command.id in self._refused:
            return True
        cluster = FakeCluster.model_validate(await self.host.get(
            BASE.format(namespace=self.namespace) + f"/fakeclusters/{self.name}"))
        try:
            plan = convert.fault_plan(command, cluster)
        except ValueError as error:
            self._refuse(command, f"the plan is not a FaultPlan spec: {error}")
            return False
        try:
            created = await self.host.create(self._plans, plan)
        except Conflict:
            return True  # delivered before: it exists, so it ran (or runs) once
        except (Invalid, BadRequest) as error:
            self._refuse(command, f"the API server refused FaultPlan "
                                  f"{plan['metadata']['name']}: {error}")
            return False
        logger.info("hub command %s: FaultPlan %s/%s created", command.id, self.namespace,
                    created["metadata"]["name"])
        if (result := convert.result(created)) is not None:
            self._send(result)
        return False

    async def _stop(self, command: member_pb2.Command) -> bool:
        start_id = command.stop_plan.command_id
        name = convert.plan_name(command.run_id, self.name)
        try:
            await self.host.delete(f"{self._plans}/{name}")
            message = f"FaultPlan {self.namespace}/{name} deleted: its faults are recovered"
        except NotFound:
            message = f"FaultPlan {self.namespace}/{name} was not there"
        self._refused.pop(start_id, None)
        self._send(member_pb2.CommandResult(command_id=command.id, message=message,
                                            phase=member_pb2.COMMAND_PHASE_SUCCEEDED))
        return False

    def _refuse(self, command: member_pb2.Command, why: str) -> None:
        logger.warning("hub command %s refused: %s", command.id, why)
        result = convert.refused(command, why)
        self._refused[command.id] = result
        self._send(result)

    def _send(self, result: member_pb2.CommandResult) -> None:
        self._reported[result.command_id] = result.SerializeToString()
        self.report(result)

    def faults(self) -> LinkFaults:
        faults = hub_link_faults(self._annotations())
        return LinkFaults(to_hub_dropped=faults.to_hub_dropped,
                          from_hub_dropped=faults.from_hub_dropped, latency=faults.latency)

    def connected(self, up: bool, message: str) -> None:
        self._on_state(up, message)

    # -- beside the link ------------------------------------------------------------------------

    async def observe(self, stop_flag: asyncio.Event) -> None:
        """Report results as the FaultPlans change; keep the inventory fresh."""
        pools_at = pods_at = 0.0
        while not stop_flag.is_set():
            now = time.monotonic()
            try:
                await self._report_changes()
                if now >= pods_at:
                    await self._refresh_pods()
                    pods_at = now + PODS_EVERY
                if now >= pools_at:
                    await self._refresh_pools()
                    pools_at = now + POOLS_EVERY
            except K8sError as error:
                logger.warning("hub link of %s/%s cannot observe: %s", self.namespace,
                               self.name, error)
            await self.clock.wait(stop_flag, OBSERVE_EVERY)

    async def _report_changes(self) -> None:
        listed = await self.host.get(self._plans, self._selector)
        for plan in listed.get("items", []):
            result = convert.result(plan)
            if result is None:
                continue
            encoded = result.SerializeToString()
            if self._reported.get(result.command_id) != encoded:
                self._send(result)

    async def _refresh_pools(self) -> None:
        listed = await self.host.get(BASE.format(namespace=self.namespace) + "/fakenodepools")
        pools = [FakeNodePool.model_validate(item) for item in listed.get("items", [])
                 if (item.get("spec") or {}).get("clusterRef") == self.name]
        self._inventory = convert.inventory(pools, self._pods)

    async def _refresh_pods(self) -> None:
        client = self._member_client()
        if client is None:
            return
        # From the API server's watch cache (resourceVersion=0): no etcd read for it.
        listed: dict[str, Any] = await client.get("/api/v1/pods", {"resourceVersion": "0"})
        self._pods = convert.count_phases(listed.get("items", []))
