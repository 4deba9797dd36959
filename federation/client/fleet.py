"""The fleet API for users and the CLI: typed async calls over FleetService."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

from opentelemetry import trace

from federation.api import common_pb2, fleet_pb2, fleet_pb2_grpc
from federation.client.channels import HubAddress, bearer, open_channel


class FleetClient:
    """``async with FleetClient(hub, token) as fleet: await fleet.list_clusters()``.

    A call made inside a span is traced, its context in the call's metadata: the hub's
    handling of it joins the caller's trace. ``traceparent`` of run_plan and submit_workload
    names another parent for the run or workload, for callers that have no span of their own.
    """

    def __init__(self, hub: HubAddress, token: str, *, timeout: float = 10.0,
                 tracer_provider: trace.TracerProvider | None = None) -> None:
        self._channel = open_channel(hub, tracer_provider=tracer_provider)
        self._stub = fleet_pb2_grpc.FleetServiceStub(self._channel)
        self._metadata = bearer(token)
        self.timeout = timeout

    async def __aenter__(self) -> FleetClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def list_clusters(self, selector: common_pb2.ClusterSelector | None = None
                            ) -> list[common_pb2.Member]:
        response = await self._stub.ListClusters(
            fleet_pb2.ListClustersRequest(selector=selector), metadata=self._metadata,
            timeout=self.timeout)
        return list(response.members)

    async def watch_clusters(self, selector: common_pb2.ClusterSelector | None = None
                             ) -> AsyncIterator[fleet_pb2.ClusterEvent]:
        call = self._stub.WatchClusters(fleet_pb2.WatchClustersRequest(selector=selector),
                                        metadata=self._metadata)
        try:
            async for event in call:
                yield event
        finally:
            call.cancel()

    async def run_plan(self, plan_json: str, clusters: common_pb2.ClusterSelector | None = None,
                       *, start_delay: float | None = None, name: str = "",
                       traceparent: str = "") -> fleet_pb2.Run:
        request = fleet_pb2.RunPlanRequest(plan=plan_json, clusters=clusters, name=name,
                                           traceparent=traceparent)
        if start_delay is not None:
            request.start_delay.FromNanoseconds(int(start_delay * 1e9))
        response = await self._stub.RunPlan(request, metadata=self._metadata,
                                            timeout=self.timeout)
        return response.run

    async def get_run(self, run_id: str) -> fleet_pb2.Run:
        return await self._stub.GetRun(fleet_pb2.GetRunRequest(run_id=run_id),
                                       metadata=self._metadata, timeout=self.timeout)

    async def cancel_run(self, run_id: str) -> fleet_pb2.Run:
        return await self._stub.CancelRun(fleet_pb2.CancelRunRequest(run_id=run_id),
                                          metadata=self._metadata, timeout=self.timeout)

    async def list_runs(self) -> list[fleet_pb2.Run]:
        response = await self._stub.ListRuns(fleet_pb2.ListRunsRequest(),
                                             metadata=self._metadata, timeout=self.timeout)
        return list(response.runs)

    async def watch_run(self, run_id: str) -> AsyncIterator[fleet_pb2.Run]:
        call = self._stub.WatchRun(fleet_pb2.WatchRunRequest(run_id=run_id),
                                   metadata=self._metadata)
        try:
            async for run in call:
                yield run
        finally:
            call.cancel()

    async def submit_workload(self, spec: fleet_pb2.WorkloadSpec, *, name: str = "",
                              start_delay: float | None = None,
                              traceparent: str = "") -> fleet_pb2.Workload:
        request = fleet_pb2.SubmitWorkloadRequest(spec=spec, name=name, traceparent=traceparent)
        if start_delay is not None:
            request.start_delay.FromNanoseconds(int(start_delay * 1e9))
        return await self._stub.SubmitWorkload(request, metadata=self._metadata,
                                               timeout=self.timeout)

    async def get_workload(self, workload_id: str, *, jobs: bool = False) -> fleet_pb2.Workload:
        return await self._stub.GetWorkload(
            fleet_pb2.GetWorkloadRequest(workload_id=workload_id, jobs=jobs),
            metadata=self._metadata, timeout=self.timeout)

    async def list_workloads(self) -> list[fleet_pb2.Workload]:
        response = await self._stub.ListWorkloads(fleet_pb2.ListWorkloadsRequest(),
                                                  metadata=self._metadata, timeout=self.timeout)
        return list(response.workloads)

    async def cancel_workload(self, workload_id: str) -> fleet_pb2.Workload:
        return await self._stub.CancelWorkload(
            fleet_pb2.CancelWorkloadRequest(workload_id=workload_id), metadata=self._metadata,
            timeout=self.timeout)

    async def watch_workload(self, workload_id: str) -> AsyncIterator[fleet_pb2.Workload]:
        call = self._stub.WatchWorkload(fleet_pb2.WatchWorkloadRequest(workload_id=workload_id),
                                        metadata=self._metadata)
        try:
            async for workload in call:
                yield workload
        finally:
            call.cancel()


def selector(names: list[str] | None = None, labels: dict[str, str] | None = None
             ) -> common_pb2.ClusterSelector:
    return common_pb2.ClusterSelector(names=names or [], match_labels=labels or {})
