"""The two gRPC services over :class:`~federation.hub.core.Hub`: authentication, validation,
translation, and nothing else. MemberService speaks to the hub's sessions; FleetService to
its runs, workloads and watchers.

Every call is authenticated first (``authorization: Bearer <token>``): MemberService takes a
member token and learns from it which cluster speaks; FleetService takes the fleet token. Then
the request is validated (INVALID_ARGUMENT naming every bad field) before anything changes.
A refusal of the hub maps to its gRPC code; an unexpected error of ours ends only that call,
with INTERNAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from federation.api import common_pb2, fleet_pb2, fleet_pb2_grpc, member_pb2, member_pb2_grpc
from federation.client import tokens
from federation.hub import convert, validation
from federation.hub.core import Hub
from federation.hub.errors import Refused
from federation.hub.membership import Ambiguous
from federation.hub.sending import Session as MemberSession
from primitives.names import canonical_member_name

logger = logging.getLogger(__name__)

#: A session's first message (its Hello) must come within this long.
HELLO_TIMEOUT = 30.0
WATCH_RUN_COALESCE = 0.1
#: A workload of thousands of Jobs changes many times a second; watchers get one message a
#: second at most.
WATCH_WORKLOAD_COALESCE = 1.0

Context = grpc.aio.ServicerContext[Any, Any]
Result = TypeVar("Result")


async def _abort(context: Context, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable: abort raises")


def _bearer(context: Context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
            return value.removeprefix("Bearer ").strip()
    return ""


async def _invalid(context: Context, problems: list[str]) -> None:
    if problems:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems))


@contextlib.asynccontextmanager
async def _answering(context: Context, name: str) -> AsyncIterator[None]:
    """Refusals become their status codes; a defect of ours becomes INTERNAL for this call."""
    try:
        yield
    except Refused as refusal:
        await _abort(context, grpc.StatusCode[refusal.code], str(refusal))
    except (asyncio.CancelledError, grpc.aio.AbortError):
        raise
    except Exception as error:
        if context.done():
            # gRPC ended the call first (the client left, or sent more metadata than gRPC
            # takes, and gRPC still starts a stream's handler): no answer can go out.
            logger.warning("%s ended before the hub answered (%r)", name, error)
            return
        logger.exception("%s failed", name)
        await _abort(context, grpc.StatusCode.INTERNAL, f"{name} failed in the hub: {error!r}")


def _guarded(method: Callable[..., Awaitable[Result]]) -> Callable[..., Awaitable[Result]]:
    @functools.wraps(method)
    async def call(self: Any, request: Any, context: Context) -> Result:
        async with _answering(context, method.__name__):
            return await method(self, request, context)
        raise grpc.aio.AbortError("the call ended before the hub answered")
    return call


def _guarded_stream(method: Callable[..., AsyncIterator[Result]]
                    ) -> Callable[..., AsyncIterator[Result]]:
    @functools.wraps(method)
    async def call(self: Any, request: Any, context: Context) -> AsyncIterator[Result]:
        async with _answering(context, method.__name__):
            async for item in method(self, request, context):
                yield item
    return call


class MemberService(member_pb2_grpc.MemberServiceServicer):
    def __init__(self, hub: Hub, key: bytes) -> None:
        self.hub = hub
        self.key = key

    async def _cluster(self, context: Context) -> str:
        token = _bearer(context)
        if not token:
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED,
                         "authorization: missing; send 'authorization: Bearer <member token>'")
        try:
            return tokens.check_member(self.key, token)
        except tokens.TokenError as error:
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, f"authorization: {error}")

    async def _same(self, context: Context, claimed: str, cluster: str, field: str) -> None:
        if claimed != cluster:
            await _abort(context, grpc.StatusCode.PERMISSION_DENIED,
                         f"{field}: {claimed!r}, but the token is for cluster {cluster!r}; a "
                         f"member speaks only for its own cluster")

    @_guarded
    async def Register(self, request: member_pb2.RegisterRequest,
                       context: Context) -> member_pb2.RegisterResponse:
        cluster = await self._cluster(context)
        await _invalid(context, validation.register(request))
        identity = convert.identity(request.cluster)
        await self._same(context, identity.key, cluster, "cluster.namespace/name")
        await self.hub.sessions.register(identity, convert.inventory(request.capacity))
        settings = self.hub.settings
        return member_pb2.RegisterResponse(
            hub_id=self.hub.hub_id,
            heartbeat_interval=convert.duration(settings.heartbeat_interval),
            grace=convert.duration(settings.grace))

    @_guarded
    async def Deregister(self, request: member_pb2.DeregisterRequest,
                         context: Context) -> member_pb2.DeregisterResponse:
        cluster = await self._cluster(context)
        await _invalid(context, validation.cluster_name(request.cluster, "cluster")
                       + validation.host(request.host, "host")
                       + validation.traceparent(request.traceparent))
        await self._same(context, canonical_member_name(request.cluster), cluster, "cluster")
        await self.hub.sessions.deregister(cluster, request.host)
        return member_pb2.DeregisterResponse()

    @_guarded_stream
    async def Session(self, request_iterator: AsyncIterator[member_pb2.MemberMessage],
                      context: Context) -> AsyncIterator[member_pb2.HubMessage]:
        cluster = await self._cluster(context)
        try:
            hello = await asyncio.wait_for(anext(request_iterator), HELLO_TIMEOUT)
        except StopAsyncIteration:
            return
        except TimeoutError:
            await _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED,
                         f"hello: none within {HELLO_TIMEOUT:g}s; a session opens with Hello")
        await _invalid(context, validation.member_message(hello, first=True))
        await self._same(context, canonical_member_name(hello.hello.cluster), cluster,
                         "hello.cluster")
        session = self.hub.sessions.open_session(cluster, hello.hello.commands)
        failure: list[tuple[grpc.StatusCode, str]] = []
        reader = asyncio.create_task(self._read(request_iterator, session, failure),
                                     name=f"session-{cluster}")
        try:
            while True:
                message = await session.outbox.get()
                if message is None:
                    break
                yield message
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            self.hub.sessions.close_session(session)
        if failure:
            await _abort(context, *failure[0])

    async def _read(self, messages: AsyncIterator[member_pb2.MemberMessage],
                    session: MemberSession, failure: list[tuple[grpc.StatusCode, str]]) -> None:
        try:
            async for message in messages:
                if not self.hub.sessions.current(session):
                    break
                problems = validation.member_message(message, first=False)
                if problems:
                    failure.append((grpc.StatusCode.INVALID_ARGUMENT, "; ".join(problems)))
                    break
                kind = message.WhichOneof("kind")
                if kind == "heartbeat":
                    self.hub.sessions.heartbeat(session, message.heartbeat)
                elif kind == "ack":
                    self.hub.sessions.acknowledged(session, message.ack.command_id,
                                                   message.traceparent)
                elif kind == "result":
                    self.hub.sessions.reported(session, message.result, message.traceparent)
        except Refused as refusal:
            failure.append((grpc.StatusCode[refusal.code], str(refusal)))
        except grpc.aio.AioRpcError:
            pass  # the member went away; closing the session says so
        except Exception as error:
            logger.exception("session of %s failed", session.cluster)
            failure.append((grpc.StatusCode.INTERNAL, f"the hub failed reading: {error!r}"))
        finally:
            session.close()


class FleetService(fleet_pb2_grpc.FleetServiceServicer):
    def __init__(self, hub: Hub, key: bytes) -> None:
        self.hub = hub
        self.key = key

    async def _authorise(self, context: Context) -> None:
        token = _bearer(context)
        if not token:
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED,
                         "authorization: missing; send 'authorization: Bearer <fleet token>'")
        try:
            tokens.check_fleet(self.key, token)
        except tokens.TokenError as error:
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, f"authorization: {error}")

    def _resolve(self, name: str, field: str) -> str:
        """A member name as the user wrote it (``west`` for the only west), as the fleet
        knows it (``team-a/west``)."""
        if not name:
            return name
        try:
            return self.hub.membership.resolve(name)
        except Ambiguous as error:
            raise Refused("FAILED_PRECONDITION", f"{field}: {error}") from error

    def _selector(self, message: common_pb2.ClusterSelector, field: str) -> dict[str, Any]:
        selector = convert.selector(message)
        selector["names"] = [self._resolve(name, f"{field}.names[{index}]")
                             for index, name in enumerate(selector["names"])]
        return selector

    @_guarded
    async def ListClusters(self, request: fleet_pb2.ListClustersRequest,
                           context: Context) -> fleet_pb2.ListClustersResponse:
        await self._authorise(context)
        await _invalid(context, validation.selector(request.selector, "selector"))
        selector = self._selector(request.selector, "selector")
        return fleet_pb2.ListClustersResponse(members=[
            convert.member_message(member)
            for _, member in sorted(self.hub.membership.members.items())
            if convert.selects(selector, member.identity)])

    @_guarded_stream
    async def WatchClusters(self, request: fleet_pb2.WatchClustersRequest,
                            context: Context) -> AsyncIterator[fleet_pb2.ClusterEvent]:
        await self._authorise(context)
        await _invalid(context, validation.selector(request.selector, "selector"))
        watcher = self.hub.watching.watch(self._selector(request.selector, "selector"))
        try:
            while (event := await watcher.events.get()) is not None:
                yield event
                if watcher.overflowed and watcher.events.empty():
                    break
        finally:
            self.hub.watching.unwatch(watcher)
        if watcher.overflowed:
            await _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                         "the watch fell behind the fleet's changes; watch again")

    @_guarded
    async def RunPlan(self, request: fleet_pb2.RunPlanRequest,
                      context: Context) -> fleet_pb2.RunPlanResponse:
        await self._authorise(context)
        await _invalid(context, validation.run_plan(request))
        delay = request.start_delay.ToNanoseconds() / 1e9 \
            if request.HasField("start_delay") else None
        run = await self.hub.running.run_plan(request.plan,
                                              self._selector(request.clusters, "clusters"),
                                              delay, request.name,
                                              traceparent=request.traceparent)
        return fleet_pb2.RunPlanResponse(run=convert.run_message(run))

    @_guarded
    async def GetRun(self, request: fleet_pb2.GetRunRequest,
                     context: Context) -> fleet_pb2.Run:
        await self._authorise(context)
        await _invalid(context, validation.run_id(request.run_id))
        return convert.run_message(self.hub.running.get_run(request.run_id))

    @_guarded
    async def CancelRun(self, request: fleet_pb2.CancelRunRequest,
                        context: Context) -> fleet_pb2.Run:
        await self._authorise(context)
        await _invalid(context, validation.run_id(request.run_id))
        return convert.run_message(await self.hub.running.cancel_run(request.run_id))

    @_guarded
    async def ListRuns(self, request: fleet_pb2.ListRunsRequest,
                       context: Context) -> fleet_pb2.ListRunsResponse:
        await self._authorise(context)
        return fleet_pb2.ListRunsResponse(runs=[
            convert.run_message(run)
            for run in sorted(self.hub.running.runs.values(), key=lambda run: run.created_at)])

    @_guarded_stream
    async def WatchRun(self, request: fleet_pb2.WatchRunRequest,
                       context: Context) -> AsyncIterator[fleet_pb2.Run]:
        await self._authorise(context)
        await _invalid(context, validation.run_id(request.run_id))
        while True:
            run = self.hub.running.get_run(request.run_id)
            changed = self.hub.running.run_changed(run.id)
            message = convert.run_message(run)
            yield message
            if message.phase != fleet_pb2.RUN_PHASE_RUNNING:
                return
            await changed.wait()
            # A run of many members changes many times a second while it fans out: one
            # message per short while tells the watcher as much.
            await self.hub.clock.sleep(WATCH_RUN_COALESCE)

    @_guarded
    async def SubmitWorkload(self, request: fleet_pb2.SubmitWorkloadRequest,
                             context: Context) -> fleet_pb2.Workload:
        await self._authorise(context)
        await _invalid(context, validation.submit_workload(request))
        delay = request.start_delay.ToNanoseconds() / 1e9 \
            if request.HasField("start_delay") else None
        spec = request.spec
        settings = convert.workload_settings(spec)
        settings = dataclasses.replace(
            settings, selector=self._selector(spec.target.clusters, "spec.target.clusters"),
            manager=self._resolve(settings.manager, "spec.target.manager"),
            weights={self._resolve(name, f"spec.target.weights[{name}]"): weight
                     for name, weight in settings.weights.items()})
        workload = await self.hub.dispatching.submit_workload(
            settings, convert.arrivals(spec.arrivals),
            convert.run_time(spec.run_time), convert.spec_data(spec), request.name, delay,
            traceparent=request.traceparent)
        return convert.workload_message(workload, self.hub.clock.now())

    @_guarded
    async def GetWorkload(self, request: fleet_pb2.GetWorkloadRequest,
                          context: Context) -> fleet_pb2.Workload:
        await self._authorise(context)
        await _invalid(context, validation.workload_id(request.workload_id))
        return convert.workload_message(self.hub.dispatching.get_workload(request.workload_id),
                                        self.hub.clock.now(), jobs=request.jobs)

    @_guarded
    async def ListWorkloads(self, request: fleet_pb2.ListWorkloadsRequest,
                            context: Context) -> fleet_pb2.ListWorkloadsResponse:
        await self._authorise(context)
        now = self.hub.clock.now()
        return fleet_pb2.ListWorkloadsResponse(workloads=[
            convert.workload_message(workload, now)
            for workload in sorted(self.hub.dispatching.workloads.values(),
                                   key=lambda w: w.created_at)])

    @_guarded
    async def CancelWorkload(self, request: fleet_pb2.CancelWorkloadRequest,
                             context: Context) -> fleet_pb2.Workload:
        await self._authorise(context)
        await _invalid(context, validation.workload_id(request.workload_id))
        workload = await self.hub.dispatching.cancel_workload(request.workload_id)
        return convert.workload_message(workload, self.hub.clock.now())

    @_guarded_stream
    async def WatchWorkload(self, request: fleet_pb2.WatchWorkloadRequest,
                            context: Context) -> AsyncIterator[fleet_pb2.Workload]:
        await self._authorise(context)
        await _invalid(context, validation.workload_id(request.workload_id))
        while True:
            workload = self.hub.dispatching.get_workload(request.workload_id)
            changed = self.hub.dispatching.workload_changed(workload.id)
            message = convert.workload_message(workload, self.hub.clock.now())
            yield message
            if message.phase != fleet_pb2.WORKLOAD_PHASE_RUNNING:
                return
            await changed.wait()
            await self.hub.clock.sleep(WATCH_WORKLOAD_COALESCE)
