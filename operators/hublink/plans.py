"""Plan commands in a member: a fleet run's ``StartPlan`` becomes a FaultPlan in the host API,
its ``StopPlan`` deletes it, and what the FaultPlan's status says goes back as the result.

A command is done once its FaultPlan exists: a delivery that finds it there is a duplicate,
executed once (so after an operator restart the hub resends nothing that ran). A plan the API
server refuses is reported Refused with its message. The FaultPlan carries the trace context
of the command's execution, and its results are reported in that context, read back from the
API like the rest of the result.

What the objects look like is :mod:`operators.hublink.convert` (pure); this module only reads
and writes them. It must not retry (the member's
:meth:`~operators.hublink.member.HostMember.execute` does, for transient errors) nor keep
anything the API does not show, beyond what :class:`~operators.hublink.reporting.Reporting`
remembers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from federation.api import member_pb2
from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.hublink import convert
from operators.hublink.reporting import Reporting, traceparent_of
from operators.k8s.client import Client
from operators.k8s.errors import BadRequest, Conflict, Invalid, NotFound
from primitives import keys, propagation

logger = logging.getLogger(__name__)

PLANS = f"/apis/{API_VERSION}/namespaces/{{namespace}}/faultplans"


class Plans:
    """The FaultPlans of fleet runs for one member."""

    def __init__(self, host: Client, namespace: str, name: str, *, reporting: Reporting,
                 cluster: Callable[[], Awaitable[FakeCluster]]) -> None:
        self.host = host
        self.namespace = namespace
        self.name = name
        self.reporting = reporting
        #: The member's FakeCluster, read now.
        self._cluster = cluster
        self._path = PLANS.format(namespace=namespace)
        self._selector = {"labelSelector": f"{keys.FLEET_RUN},{keys.CLUSTER}={name}"}

    async def results(self) -> list[member_pb2.CommandResult]:
        """The result of every fleet FaultPlan of the member, as the API shows it."""
        listed = await self.host.get(self._path, self._selector)
        return [r for plan in listed.get("items", []) if (r := convert.result(plan))]

    async def report_changes(self) -> set[str]:
        """Report each fleet FaultPlan whose result changed; returns the commands of those
        there are."""
        listed = await self.host.get(self._path, self._selector)
        commands = set()
        for plan in listed.get("items", []):
            result = convert.result(plan)
            if result is not None:
                self.reporting.update(result, plan)
                commands.add(result.command_id)
        return commands

    async def start(self, command: member_pb2.Command) -> bool:
        if command.id in self.reporting.refused:
            return True
        cluster = await self._cluster()
        try:
            plan = convert.fault_plan(command, cluster, propagation.traceparent())
        except ValueError as error:
            self.reporting.refuse(command, f"the plan is not a FaultPlan spec: {error}")
            return False
        try:
            created = await self.host.create(self._path, plan)
        except Conflict:
            return True  # delivered before: it exists, so it ran (or runs) once
        except (Invalid, BadRequest) as error:
            self.reporting.refuse(command, f"the API server refused FaultPlan "
                                           f"{plan['metadata']['name']}: {error}")
            return False
        logger.info("hub command %s: FaultPlan %s/%s created", command.id, self.namespace,
                    created["metadata"]["name"])
        if (result := convert.result(created)) is not None:
            self.reporting.send(result, traceparent_of(created))
        return False

    async def stop(self, command: member_pb2.Command) -> bool:
        start_id = command.stop_plan.command_id
        name = convert.plan_name(command.run_id, self.name)
        try:
            await self.host.delete(f"{self._path}/{name}")
            message = f"FaultPlan {self.namespace}/{name} deleted: its faults are recovered"
        except NotFound:
            message = f"FaultPlan {self.namespace}/{name} was not there"
        self.reporting.refused.pop(start_id, None)
        self.reporting.send(member_pb2.CommandResult(command_id=command.id, message=message,
                                                     phase=member_pb2.COMMAND_PHASE_SUCCEEDED),
                            propagation.traceparent())
        return False
