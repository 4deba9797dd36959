"""kopf glue for FaultPlan: a daemon per plan that runs it (:class:`operators.faults.running.
Runner`: observe, decide, act, sleep until the next round), and a finalizer that recovers
whatever is still injected when the plan is deleted.

Here is only what a runner needs of the operator: members reached as the FakeCluster handler
reaches them, a FakeCluster's fault entries applied under its lock
(:func:`operators.handlers.clusters.hold_components`), whether a local component runs, and
Events about the plan sent through kopf.
"""

from __future__ import annotations

from typing import Any

import kopf
from opentelemetry import trace

from operators.api.base import API_VERSION
from operators.api.clusters import FakeCluster
from operators.api.faultplans import FaultPlan
from operators.faults.deciding import still_injected
from operators.faults.delivering import CLUSTERS, CONCURRENCY
from operators.faults.running import PLAN, Connect, Runner
from operators.handlers.clusters import hold_components, member_access
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.errors import K8sError, NotFound
from operators.reconciling.clusters import cluster_key
from primitives.clocks import SYSTEM_CLOCK, Clock


class PlanRunner(Runner):
    """A plan's runner in the operator (tests pass ``connect`` to reach in-memory members)."""

    def __init__(self, runtime: Runtime, plan: FaultPlan, *,
                 connect: Connect | None = None, tracer: trace.Tracer | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.runtime = runtime
        super().__init__(plan, host=runtime.host, connect=connect or self._connect_member,
                         apply=self._apply, running=self._running, announce=self._announce,
                         cel=runtime.cel, tracer=tracer or trace.get_tracer(__name__),
                         clock=clock)

    def _connect_member(self, cluster: FakeCluster, name: str) -> Client | None:
        access = member_access(self.runtime, cluster, cluster_key(self.namespace, name))
        if access is None:
            return None
        return Client.connect(access, connections=CONCURRENCY, timeout=15)

    async def _apply(self, cluster: str) -> None:
        """Stop or start the cluster's components as its entries say, now."""
        key = cluster_key(self.namespace, cluster)
        async with self.runtime.lock(key):  # as the cluster handler: one at a time
            try:
                fresh = FakeCluster.model_validate(await self.runtime.host.get(
                    f"{CLUSTERS.format(namespace=self.namespace)}/{cluster}"))
            except NotFound:
                return
            await hold_components(self.runtime, fresh, key)

    def _running(self, cluster: str, component: str) -> bool | None:
        local = self.runtime.substrate.clusters.get(cluster_key(self.namespace, cluster))
        if local is None:
            return None
        process = local.processes.get(component)
        return process is not None and process.running

    def _announce(self, kind: str, reason: str, message: str) -> None:
        kopf.event(kopf.Body(kopf.RawBody({
            "apiVersion": API_VERSION, "kind": "FaultPlan",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid}})),
            type=kind, reason=reason, message=message)


async def run(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, *,
              clock: Clock = SYSTEM_CLOCK, **_: Any) -> None:
    """Daemon: one per plan, for as long as it runs (kopf starts it again on resume)."""
    runtime: Runtime = memo.runtime
    key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
    runtime.plans.add(key)
    try:
        plan = FaultPlan.model_validate(await runtime.host.get(PLAN.format(
            namespace=body["metadata"]["namespace"], name=body["metadata"]["name"])))
        if plan.metadata.get("deletionTimestamp"):
            return
        runner = PlanRunner(runtime, plan, tracer=runtime.tracer, clock=clock)
        await runner.run(lambda: bool(stopped))
    except K8sError as error:
        raise kopf.TemporaryError(f"plan {key}: {error}", delay=2) from error
    finally:
        runtime.plans.discard(key)


async def delete(body: kopf.Body, memo: kopf.Memo, *, clock: Clock = SYSTEM_CLOCK,
                 **_: Any) -> None:
    """Finalizer: recover everything the plan injected; the plan goes once all is undone."""
    runtime: Runtime = memo.runtime
    key = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
    if key in runtime.plans:
        # kopf stops the daemon when the plan is deleted, but runs this meanwhile: an
        # injection it is writing now must be seen here, so wait until it has stopped.
        raise kopf.TemporaryError("waiting for the plan's daemon to stop", delay=1)
    try:
        plan = FaultPlan.model_validate(await runtime.host.get(PLAN.format(
            namespace=body["metadata"]["namespace"], name=body["metadata"]["name"])))
    except NotFound:
        return
    runner = PlanRunner(runtime, plan, tracer=runtime.tracer, clock=clock)
    try:
        left = await runner.abort()
        if left:
            raise kopf.TemporaryError(still_injected(left), delay=1)
    except K8sError as error:
        raise kopf.TemporaryError(f"recovery: {error}", delay=2) from error
    finally:
        await runner.close()
