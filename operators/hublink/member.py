"""The member a hub link speaks for: a FakeCluster, observed and acted on through the host API.

It implements :class:`federation.client.member.Member` by composing its parts:

- :mod:`~operators.hublink.plans`: plan commands (a fleet run's FaultPlan);
- :mod:`~operators.hublink.jobwatching`: job commands (a fleet workload's Jobs, created and
  deleted, and the watches that follow them);
- :mod:`~operators.hublink.inventorying`: the inventory sent with heartbeats;
- :mod:`~operators.hublink.reporting`: the results, each change once.

Everything it tells the hub comes from what the API shows, never from memory alone: the Hello
lists the FaultPlans of fleet runs and the workload Jobs that exist for the cluster (so after
an operator restart the hub still resends nothing that ran), and a command is acknowledged once
its object exists (a delivery that finds it there is a duplicate, executed once). Transient API
errors are retried here, with back-off; the command waits, and the hub keeps it.

:meth:`HostMember.observe` runs beside the link (supervised by the hub link's daemon): it keeps
the watches running, reports each fleet FaultPlan whose result changed, forgets what was
reported of commands whose objects are gone, and refreshes the inventory.

Tracing: :meth:`HostMember.execute` runs in the link's ``member.execute_command`` span; the
FaultPlan or Job it creates carries that span's context (annotation
``fakefleet.dev/traceparent``), and every result of a command is reported in the context its
object carries.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from federation.api import common_pb2, member_pb2
from federation.client.member import LinkFaults
from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.injections import hub_link_faults
from operators.hublink import convert
from operators.hublink.inventorying import Inventorying
from operators.hublink.jobwatching import JobWatching
from operators.hublink.plans import Plans
from operators.hublink.reporting import Reporting
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, transient
from operators.k8s.retrying import Backoff
from primitives.clocks import SYSTEM_CLOCK, Clock
from primitives.names import member_name

logger = logging.getLogger(__name__)

CLUSTER = f"/apis/{API_VERSION}/namespaces/{{namespace}}/fakeclusters/{{name}}"
#: How often fleet FaultPlans are looked at for results, and the watches and the inventory
#: tended (s).
OBSERVE_EVERY = 1.0


async def _no_workers(name: str) -> Client | None:
    return None


class HostMember:
    def __init__(self, host: Client, namespace: str, name: str, *, host_id: str,
                 annotations: Callable[[], Mapping[str, str]],
                 member_client: Callable[[], Client | None] = lambda: None,
                 worker_client: Callable[[str], Awaitable[Client | None]] = _no_workers,
                 on_state: Callable[[bool, str], None] = lambda up, message: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.host = host
        self.namespace = namespace
        self.name = name
        self.host_id = host_id
        self._annotations = annotations
        self._on_state = on_state
        self.clock = clock
        self.reporting = Reporting(member_name(namespace, name), name)
        self.plans = Plans(host, namespace, name, reporting=self.reporting,
                           cluster=self._cluster)
        self.jobs = JobWatching(namespace, name, reporting=self.reporting,
                                member_client=member_client, worker_client=worker_client,
                                clock=clock)
        self.inventorying = Inventorying(host, namespace, name, member_client=member_client)

    @property
    def report(self) -> Callable[[member_pb2.CommandResult], None]:
        """Where results go (the link's report, once it exists)."""
        return self.reporting.report

    @report.setter
    def report(self, report: Callable[[member_pb2.CommandResult], None]) -> None:
        self.reporting.report = report

    @property
    def fleet_name(self) -> str:
        """The member's name in the fleet (what its token and its commands' ids name)."""
        return member_name(self.namespace, self.name)

    async def _cluster(self) -> FakeCluster:
        return FakeCluster.model_validate(await self.host.get(
            CLUSTER.format(namespace=self.namespace, name=self.name)))

    # -- what the link asks ---------------------------------------------------------------------

    async def introduce(self) -> member_pb2.RegisterRequest:
        cluster = await self._cluster()
        await self.inventorying.refresh_pools()
        return convert.register_request(cluster, self.host_id, self.inventorying.inventory)

    async def inventory(self) -> common_pb2.Inventory | None:
        return self.inventorying.changed()

    async def resync(self) -> list[member_pb2.CommandResult]:
        self.inventorying.resend()  # a new session: the hub gets the inventory again
        results = await self.plans.results()
        results += await self.jobs.results()
        return self.reporting.resynced(results)

    async def execute(self, command: member_pb2.Command) -> bool:
        backoff = Backoff(base=0.5, cap=10.0)
        while True:
            try:
                action = command.WhichOneof("action")
                if action == "stop_plan":
                    return await self.plans.stop(command)
                if action == "create_job":
                    return await self.jobs.create(command)
                if action == "delete_jobs":
                    return await self.jobs.delete(command)
                return await self.plans.start(command)
            except K8sError as error:
                if not transient(error):
                    raise
                logger.warning("hub command %s in %s/%s: %s (retrying)", command.id,
                               self.namespace, self.name, error)
                await self.clock.sleep(backoff.next())

    def faults(self) -> LinkFaults:
        faults = hub_link_faults(self._annotations())
        return LinkFaults(to_hub_dropped=faults.to_hub_dropped,
                          from_hub_dropped=faults.from_hub_dropped, latency=faults.latency)

    def connected(self, up: bool, message: str) -> None:
        self._on_state(up, message)

    # -- beside the link ------------------------------------------------------------------------

    async def observe(self, stop_flag: asyncio.Event) -> None:
        """Report results as the FaultPlans and workload Jobs change; keep the inventory
        fresh."""
        try:
            while not stop_flag.is_set():
                await self.jobs.watch_member()
                now = self.clock.now()
                await self.jobs.watch_workers(now)
                try:
                    plans = await self.plans.report_changes()
                    self.reporting.retain(plans | self.jobs.commands())
                    await self.inventorying.refresh(now)
                except K8sError as error:
                    logger.warning("hub link of %s/%s cannot observe: %s", self.namespace,
                                   self.name, error)
                await self.clock.wait(stop_flag, OBSERVE_EVERY)
        finally:
            await self.jobs.unwatch()
