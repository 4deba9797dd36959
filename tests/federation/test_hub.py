"""The hub over real gRPC on loopback, in-process: membership, liveness, commands, security,
refusals and restarts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from federation.api import common_pb2, fleet_pb2, member_pb2
from federation.client import tokens
from federation.client.channels import bearer
from federation.client.fleet import FleetClient, selector
from federation.client.member import MemberLink
from federation.client.simulated import SimulatedMember
from federation.hub.server import Tls
from tests.federation.hubs import GRACE, RawMember, RunningHub, running_hub

PLAN = json.dumps({"steps": [{"name": "xid", "target": {}, "fault": {"type": "GPUXid",
                                                                     "xid": 79}}]})
READY = common_pb2.MEMBER_STATE_READY
UNREACHABLE = common_pb2.MEMBER_STATE_UNREACHABLE


async def states(hub: RunningHub) -> dict[str, int]:
    async with hub.fleet() as fleet:
        return {m.cluster.name: m.state for m in await fleet.list_clusters()}


async def eventually(check, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def test_register_then_session_makes_a_ready_member(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        member = RawMember(hub, "west")
        response = await member.register(region="eu")
        assert response.grace.ToNanoseconds() / 1e9 == GRACE
        assert await states(hub) == {"west": UNREACHABLE}  # registered, no session yet
        await member.hello()
        await eventually(lambda: _is(hub, "west", READY))
        async with hub.fleet() as fleet:
            [listed] = await fleet.list_clusters(selector(labels={"region": "eu"}))
            assert listed.cluster.labels == {"region": "eu"}
            assert await fleet.list_clusters(selector(labels={"region": "us"})) == []
        await member.close()


async def _is(hub: RunningHub, name: str, state: int) -> bool:
    return (await states(hub)).get(name) == state


async def test_silence_makes_a_member_unreachable_and_a_heartbeat_ready_again(
        tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        events: list[tuple[int, str, str]] = []

        async def watch() -> None:
            async for event in fleet.watch_clusters():
                events.append((event.type, event.member.cluster.name, event.member.reason))

        watcher = asyncio.create_task(watch())
        member = RawMember(hub, "west")
        await member.register()
        await member.hello()
        await eventually(lambda: _is(hub, "west", READY))
        # The member sends nothing: after the grace it is Unreachable.
        await eventually(lambda: _is(hub, "west", UNREACHABLE), timeout=GRACE * 4)
        async with hub.fleet() as client:
            [listed] = await client.list_clusters()
        assert listed.reason == "HeartbeatsStopped"
        await member.beat(hub_seq=10**6)
        await eventually(lambda: _is(hub, "west", READY))
        await member.close()
        await eventually(lambda: _is(hub, "west", UNREACHABLE))
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        reasons = [reason for kind, name, reason in events
                   if kind == fleet_pb2.EVENT_TYPE_MODIFIED]
        assert reasons == ["SessionOpened", "HeartbeatsStopped", "HeartbeatsResumed",
                           "SessionClosed"]


async def test_unanswered_hub_heartbeats_make_a_member_unreachable(tmp_path: Path) -> None:
    """A link that drops what the hub sends: the member's heartbeats arrive but never echo."""
    async with running_hub(tmp_path) as hub:
        member = RawMember(hub, "west")
        await member.register()
        await member.hello()
        # Registered and not yet connected is Unreachable too: wait for the session first.
        await eventually(lambda: _is(hub, "west", READY), timeout=GRACE * 4)

        async def beat_without_echo() -> None:
            while True:
                await member.beat(hub_seq=0)
                await asyncio.sleep(0.1)

        beating = asyncio.create_task(beat_without_echo())
        await eventually(lambda: _is(hub, "west", UNREACHABLE), timeout=GRACE * 4)
        async with hub.fleet() as fleet:
            [listed] = await fleet.list_clusters()
        assert listed.reason == "HubHeartbeatsUnanswered"
        beating.cancel()
        await asyncio.gather(beating, return_exceptions=True)
        await member.close()


async def test_a_command_is_resent_until_acknowledged_and_never_after(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = RawMember(hub, "west")
        await member.register()
        await member.hello()
        run = await fleet.run_plan(PLAN, start_delay=0)
        command = await member.next_command()
        assert command.id == f"{run.id}/west/start"
        assert json.loads(command.start_plan.plan) == json.loads(PLAN)
        # Reconnect without acknowledging: the hub sends it again, same id.
        await member.close()
        member = RawMember(hub, "west")
        await member.hello()
        again = await member.next_command()
        assert again.id == command.id
        await member.send(member_pb2.MemberMessage(ack=member_pb2.CommandAck(
            command_id=command.id)))
        running = member_pb2.CommandResult(command_id=command.id,
                                           phase=member_pb2.COMMAND_PHASE_RUNNING)
        await member.send(member_pb2.MemberMessage(result=running))
        await eventually(lambda: _part_is(fleet, run.id, fleet_pb2.MEMBER_RUN_STATE_RUNNING))
        # Reconnect reporting it: nothing is resent.
        await member.close()
        member = RawMember(hub, "west")
        await member.hello(running)
        with pytest.raises(TimeoutError):
            await member.next_command(timeout=1.0)
        done = member_pb2.CommandResult(command_id=command.id, verdict="Passed",
                                        phase=member_pb2.COMMAND_PHASE_SUCCEEDED)
        await member.send(member_pb2.MemberMessage(result=done))
        finished = await _finished(fleet, run.id)
        assert finished.phase == fleet_pb2.RUN_PHASE_SUCCEEDED
        assert finished.verdict == "Passed"
        await member.close()


async def _part_is(fleet: FleetClient, run_id: str, state: int) -> bool:
    run = await fleet.get_run(run_id)
    return run.members[0].state == state


async def _finished(fleet: FleetClient, run_id: str, timeout: float = 10.0) -> fleet_pb2.Run:
    async with asyncio.timeout(timeout):
        async for run in fleet.watch_run(run_id):
            if run.phase != fleet_pb2.RUN_PHASE_RUNNING:
                return run
    raise AssertionError("the watch ended before the run finished")


async def test_a_member_link_runs_a_fleet_plan_once_and_reports_its_verdict(
        tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        members = [SimulatedMember(name, labels={"gpu": "h100"}, run_seconds=0.3)
                   for name in ("east", "west")]
        members.append(SimulatedMember("north", labels={"gpu": "a100"}))
        stop = asyncio.Event()
        links = []
        for member in members:
            member.link = MemberLink(hub.address, hub.member_token(member.name), member,
                                     member.name)
            links.append(asyncio.create_task(member.link.run(stop)))
        await eventually(lambda: _all_ready(hub, 3))
        run = await fleet.run_plan(PLAN, selector(labels={"gpu": "h100"}), start_delay=0.5)
        assert [part.cluster for part in run.members] == ["east", "west"]
        finished = await _finished(fleet, run.id)
        assert finished.phase == fleet_pb2.RUN_PHASE_SUCCEEDED
        assert finished.verdict == "Passed"
        assert all(part.state == fleet_pb2.MEMBER_RUN_STATE_SUCCEEDED
                   for part in finished.members)
        for member in members[:2]:
            [executed] = member.executed.values()
            assert executed.command.start_plan.start_at.ToNanoseconds() == \
                run.start_at.ToNanoseconds()
        assert members[2].executed == {}
        stop.set()
        await asyncio.gather(*links)
        for member in members:
            await member.stop()


async def _all_ready(hub: RunningHub, count: int) -> bool:
    listed = await states(hub)
    return len(listed) == count and all(state == READY for state in listed.values())


async def test_a_failed_member_plan_fails_the_run(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        good, bad = SimulatedMember("good"), SimulatedMember("bad", verdict="Failed")
        stop = asyncio.Event()
        tasks = []
        for member in (good, bad):
            member.link = MemberLink(hub.address, hub.member_token(member.name), member,
                                     member.name)
            tasks.append(asyncio.create_task(member.link.run(stop)))
        await eventually(lambda: _all_ready(hub, 2))
        run = await fleet.run_plan(PLAN, start_delay=0)
        finished = await _finished(fleet, run.id)
        assert finished.verdict == "Failed"
        stop.set()
        await asyncio.gather(*tasks)


async def test_cancel_stops_a_running_plan_in_each_member(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = SimulatedMember("west", run_seconds=60)
        stop = asyncio.Event()
        member.link = MemberLink(hub.address, hub.member_token("west"), member, "west")
        task = asyncio.create_task(member.link.run(stop))
        await eventually(lambda: _all_ready(hub, 1))
        run = await fleet.run_plan(PLAN, start_delay=0)
        await eventually(lambda: _part_is(fleet, run.id, fleet_pb2.MEMBER_RUN_STATE_RUNNING))
        await fleet.cancel_run(run.id)
        finished = await _finished(fleet, run.id)
        assert finished.phase == fleet_pb2.RUN_PHASE_CANCELLED
        assert f"{run.id}/west/stop" in member.executed
        stop.set()
        await task
        await member.stop()


# -- security ------------------------------------------------------------------------------

async def test_wrong_or_missing_tokens_are_refused(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        other = tokens.member_token(tokens.new_key(), "west")
        for token in (other, "nonsense", hub.fleet_token):
            member = RawMember(hub, "west", token=token)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await member.register()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization" in (refused.value.details() or "")
            await member.close()
        async with FleetClient(hub.address, hub.member_token("west")) as fleet:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await fleet.list_clusters()
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_a_member_cannot_register_as_or_act_for_another_cluster(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        victim = RawMember(hub, "east")
        await victim.register()
        await victim.hello()
        run = await fleet.run_plan(PLAN, start_delay=0)
        impostor = RawMember(hub, "east", token=hub.member_token("west"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await impostor.register()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "cluster.name" in (refused.value.details() or "")
        await impostor.close()
        west = RawMember(hub, "west")
        await west.register()
        await west.hello()
        await west.send(member_pb2.MemberMessage(ack=member_pb2.CommandAck(
            command_id=f"{run.id}/east/start")))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await west.next_command()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "ack.command_id" in (refused.value.details() or "")
        # The act was refused: east's part is still not acknowledged.
        assert (await fleet.get_run(run.id)).members[0].state == fleet_pb2.MEMBER_RUN_STATE_SENT
        for member in (victim, west):
            await member.close()


async def test_tls_with_the_project_pki(tmp_path: Path) -> None:
    from operators.controlplane.pki import ensure_hub_pki
    pki = ensure_hub_pki(tmp_path / "pki")
    tls = Tls(cert=pki.serving_cert, key=pki.serving_key, ca=pki.ca_cert)
    async with running_hub(tmp_path / "hub", tls=tls) as hub:
        member = RawMember(hub, "west")
        await member.register()
        await member.close()
        assert await states(hub) == {"west": UNREACHABLE}


# -- malformed input -----------------------------------------------------------------------

async def test_malformed_messages_get_invalid_argument_naming_the_field(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = RawMember(hub, "West_1", token=hub.member_token("West_1"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await member.register()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (refused.value.details() or "").startswith("cluster.name: 'West_1'")
        await member.close()
        for plan, field in (("{", "plan: not JSON"), ("[]", "plan: a JSON list"),
                            ('{"steps": []}', "plan.steps"),
                            ('{"steps": [{}], "startAt": "x"}', "plan.startAt")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await fleet.run_plan(plan)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in (refused.value.details() or ""), refused.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await fleet.run_plan(PLAN, common_pb2.ClusterSelector(match_expressions=[
                common_pb2.LabelRequirement(key="gpu", operator="Near")]))
        assert "clusters.match_expressions[0].operator" in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await fleet.run_plan(PLAN)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "selector picks no registered member" in (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await fleet.get_run("r-none")
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_session_must_open_with_hello(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        member = RawMember(hub, "west")
        await member.register()
        call = member.stub.Session(metadata=bearer(hub.member_token("west")))
        await call.write(member_pb2.MemberMessage(heartbeat=member_pb2.MemberHeartbeat(seq=1)))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (refused.value.details() or "").startswith("kind: the first message")
        await member.close()
        # The hub serves on.
        assert await states(hub) == {"west": UNREACHABLE}


# -- restarts ------------------------------------------------------------------------------

async def test_a_restarted_hub_knows_its_members_and_runs_and_resends_nothing_done(
        tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = RawMember(hub, "west")
        await member.register(region="eu")
        await member.hello()
        run = await fleet.run_plan(PLAN, start_delay=0)
        command = await member.next_command()
        await member.send(member_pb2.MemberMessage(ack=member_pb2.CommandAck(
            command_id=command.id)))
        await eventually(lambda: _part_is(fleet, run.id,
                                          fleet_pb2.MEMBER_RUN_STATE_ACKNOWLEDGED))
        await member.close()
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        [listed] = await fleet.list_clusters()
        assert listed.cluster.labels == {"region": "eu"}
        restored = await fleet.get_run(run.id)
        assert restored.members[0].state == fleet_pb2.MEMBER_RUN_STATE_ACKNOWLEDGED
        member = RawMember(hub, "west")
        await member.register(region="eu")
        running = member_pb2.CommandResult(command_id=command.id,
                                           phase=member_pb2.COMMAND_PHASE_RUNNING)
        await member.hello(running)
        with pytest.raises(TimeoutError):
            await member.next_command(timeout=1.0)
        await member.close()


async def test_health_and_reflection_are_served(tmp_path: Path) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from federation.client.channels import open_channel
    async with running_hub(tmp_path) as hub:
        channel = open_channel(hub.address)
        checked = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="fakefleet.federation.v1alpha1.FleetService"))
        assert checked.status == health_pb2.HealthCheckResponse.SERVING
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        async for response in call:
            names = {s.name for s in response.list_services_response.service}
            break
        assert {"fakefleet.federation.v1alpha1.MemberService",
                "fakefleet.federation.v1alpha1.FleetService"} <= names
        await channel.close()
