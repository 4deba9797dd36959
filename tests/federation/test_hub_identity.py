"""A member's identity in the fleet is its FakeCluster's namespace and name: two FakeClusters
of one name in two namespaces are two members, a host deregisters only what it registered,
another host cannot take a member over, and names with dots join the fleet."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from federation.api import common_pb2, fleet_pb2, member_pb2
from federation.client import tokens
from federation.client.fleet import FleetClient
from federation.client.member import MemberLink, deregister
from federation.hub import validation
from federation.hub.membership import HostConflict, Identity, Inventory, Membership, State
from operators.api.base import API_VERSION
from operators.hublink import member as host_module
from operators.hublink.jobwatching import JobWatching
from operators.hublink.member import HostMember
from operators.hublink.reporting import KEEP_REFUSED, Reporting
from operators.k8s.client import Client
from primitives import keys, names
from primitives.clocks import SYSTEM_CLOCK
from tests.fakes.k8s import MemoryTransport
from tests.federation.hubs import RawMember, RunningHub, running_hub

SPEC = {"steps": [{"name": "xid", "target": {"nodes": {}},
                   "fault": {"type": "GPUXid", "xid": 79}}]}
READY = common_pb2.MEMBER_STATE_READY


def fake_cluster(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "FakeCluster",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"labels": {"gpu": "h100"}},
            "status": {"phase": "Ready", "endpoint": "https://127.0.0.1:6443",
                       "kubernetesVersion": "v1.36.3"}}


def plans(namespace: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/faultplans"


async def eventually(check: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            answer = check()
            if answer if isinstance(answer, bool) else await answer:
                return
            await asyncio.sleep(0.05)


async def members(hub: RunningHub) -> dict[str, int]:
    async with hub.fleet() as fleet:
        return {names.member_name(m.cluster.namespace, m.cluster.name): m.state
                for m in await fleet.list_clusters()}


async def parts(fleet: FleetClient, run_id: str) -> dict[str, int]:
    return {part.cluster: part.state for part in (await fleet.get_run(run_id)).members}


# -- names -------------------------------------------------------------------------------------

def test_a_member_name_is_namespace_and_name_with_default_left_out() -> None:
    assert names.member_name("team-a", "west") == "team-a/west"
    assert names.member_name("default", "west") == names.member_name("", "west") == "west"
    assert names.split_member_name("team-a/west.eu") == ("team-a", "west.eu")
    assert names.split_member_name("west") == ("default", "west")
    assert names.canonical_member_name("default/west") == "west"
    for good in ("west", "west.eu", "team-a/west", "team-a/west.eu", "a" * 63):
        assert names.is_member_name(good), good
    for bad in ("", "West", "team.a/west", "a/b/c", "/west", "team-a/", "a" * 64, "west.",
                "west_1"):
        assert not names.is_member_name(bad), bad


def test_a_token_is_bound_to_the_namespace_and_name() -> None:
    key = tokens.new_key()
    assert tokens.member_token(key, "default/west") == tokens.member_token(key, "west")
    a, b = tokens.member_token(key, "team-a/west"), tokens.member_token(key, "team-b/west")
    assert a != b
    assert tokens.check_member(key, a) == "team-a/west"
    assert tokens.check_member(key, tokens.member_token(key, "west.eu")) == "west.eu"
    # One made for the name alone (as before namespaces counted) is namespace default's.
    assert tokens.check_member(key, tokens.member_token(key, "west")) == "west"


def test_the_hub_checks_the_namespace_and_takes_dotted_names() -> None:
    def register(name: str, namespace: str = "") -> list[str]:
        return validation.register(member_pb2.RegisterRequest(
            cluster=common_pb2.ClusterIdentity(name=name, namespace=namespace)))

    assert register("west.eu") == []
    assert register("west", "team-a") == []
    [problem] = register("west", "Team_A")
    assert problem.startswith("cluster.namespace: 'Team_A' is not a namespace")
    [problem] = register("west_eu")
    assert problem.startswith("cluster.name: 'west_eu' is not a FakeCluster name")
    assert validation.cluster_name("team-a/west.eu", "hello.cluster") == []
    [problem] = validation.cluster_name("a/b/c", "hello.cluster")
    assert "[namespace/]name" in problem


# -- membership: one host per member -----------------------------------------------------------

def test_another_host_is_refused_until_the_holder_has_long_been_unreachable() -> None:
    membership = Membership(grace=6.0, takeover=300.0)
    mine = Identity(name="west", namespace="team-a", host="host-1")
    theirs = Identity(name="west", namespace="team-a", host="host-2")
    membership.register(mine, Inventory(), now=0.0)
    membership.connect("team-a/west", now=1.0)
    with pytest.raises(HostConflict, match="registered by host 'host-1' \\(connected\\)"):
        membership.register(theirs, Inventory(), now=2.0)
    membership.disconnect("team-a/west", now=10.0)
    with pytest.raises(HostConflict, match="Unreachable for 100s"):
        membership.register(theirs, Inventory(), now=110.0)
    # The same host, and a FakeCluster of that name in another namespace, are welcome.
    membership.register(mine, Inventory(), now=111.0)
    membership.register(Identity(name="west", namespace="team-b", host="host-2"), Inventory(),
                        now=111.0)
    assert sorted(membership.members) == ["team-a/west", "team-b/west"]
    # Gone for good: after the takeover time another host may register it.
    member = membership.register(theirs, Inventory(), now=10.0 + 300.0)
    assert member.identity.host == "host-2"
    assert member.state is State.UNREACHABLE


# -- over the wire -----------------------------------------------------------------------------

async def test_deleting_one_of_two_same_named_clusters_leaves_the_other_and_its_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """FakeClusters west in namespaces team-a and team-b, each behind its operator's hub link,
    both in a fleet run. team-b's is deleted (its link deregisters it): team-a's stays
    registered and Ready, and its part of the run carries on to its verdict."""
    monkeypatch.setattr(host_module, "OBSERVE_EVERY", 0.05)
    api = MemoryTransport(SYSTEM_CLOCK)
    host = Client(api, clock=SYSTEM_CLOCK)
    for namespace in ("team-a", "team-b"):
        api.put(f"/apis/{API_VERSION}/namespaces/{namespace}/fakeclusters",
                fake_cluster(namespace, "west"))
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        stop_flag = asyncio.Event()
        tasks = []
        links = {}
        for namespace in ("team-a", "team-b"):
            member = HostMember(host, namespace, "west", host_id="host-1",
                                annotations=dict, clock=SYSTEM_CLOCK)
            token = hub.member_token(member.fleet_name)
            link = MemberLink(hub.address, token, member, member.fleet_name)
            member.report = link.report
            links[namespace] = token
            tasks += [asyncio.create_task(link.run(stop_flag)),
                      asyncio.create_task(member.observe(stop_flag))]
        try:
            await eventually(lambda: _all_ready(hub, ["team-a/west", "team-b/west"]))
            run = await fleet.run_plan(json.dumps(SPEC), start_delay=0)
            assert sorted(part.cluster for part in run.members) == ["team-a/west",
                                                                     "team-b/west"]
            for namespace in ("team-a", "team-b"):
                await eventually(functools.partial(_made, api, namespace, f"{run.id}-west"))
            await eventually(lambda: _parts_are(fleet, run.id, RUNNING_PART))

            await deregister(hub.address, links["team-b"], "team-b/west", "host-1")

            assert await members(hub) == {"team-a/west": READY}
            after = await parts(fleet, run.id)
            assert after["team-a/west"] == fleet_pb2.MEMBER_RUN_STATE_RUNNING
            assert after["team-b/west"] == fleet_pb2.MEMBER_RUN_STATE_FAILED
            await host.patch(f"{plans('team-a')}/{run.id}-west", {"status": {
                "phase": "Succeeded", "stepsDone": "1/1", "verdict": "Passed"}})
            await eventually(lambda: _part_is(fleet, run.id, "team-a/west",
                                              fleet_pb2.MEMBER_RUN_STATE_SUCCEEDED))
            assert await members(hub) == {"team-a/west": READY}
        finally:
            stop_flag.set()
            await asyncio.gather(*tasks)


RUNNING_PART = fleet_pb2.MEMBER_RUN_STATE_RUNNING


def _made(api: MemoryTransport, namespace: str, plan: str) -> bool:
    return [p["metadata"]["name"] for p in api.objects(plans(namespace))] == [plan]


async def _all_ready(hub: RunningHub, expected: list[str]) -> bool:
    listed = await members(hub)
    return sorted(listed) == expected and all(state == READY for state in listed.values())


async def _parts_are(fleet: FleetClient, run_id: str, state: int) -> bool:
    return all(value == state for value in (await parts(fleet, run_id)).values())


async def _part_is(fleet: FleetClient, run_id: str, cluster: str, state: int) -> bool:
    return (await parts(fleet, run_id)).get(cluster) == state


async def test_a_second_host_is_refused_and_cannot_deregister_what_it_did_not_register(
        tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        first = RawMember(hub, "west", namespace="team-a", host="host-1")
        await first.register()
        await first.hello()
        first.read_in_background()
        second = RawMember(hub, "west", namespace="team-a", host="host-2")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await second.register()
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "cluster 'team-a/west' is registered by host 'host-1'" in \
            (refused.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await second.deregister()
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "it stays in the fleet" in (refused.value.details() or "")
        assert await members(hub) == {"team-a/west": READY}
        # Its own host takes it out.
        await first.deregister()
        assert await members(hub) == {}
        for member in (first, second):
            await member.close()


async def test_a_token_for_one_namespace_cannot_speak_for_another(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub:
        impostor = RawMember(hub, "west", namespace="team-b",
                             token=hub.member_token("team-a/west"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await impostor.register()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'team-b/west', but the token is for cluster 'team-a/west'" in \
            (refused.value.details() or "")
        await impostor.close()


async def test_a_cluster_with_dots_in_its_name_joins_the_fleet(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        member = RawMember(hub, "west.eu", namespace="team-a")
        await member.register()
        await member.hello()
        member.read_in_background()
        await eventually(lambda: _all_ready(hub, ["team-a/west.eu"]))
        run = await fleet.run_plan(json.dumps(SPEC), common_pb2.ClusterSelector(
            names=["team-a/west.eu"]), start_delay=0)
        command = await member.next_command()
        assert command.id == f"{run.id}/team-a/west.eu/start"
        await member.send(member_pb2.MemberMessage(ack=member_pb2.CommandAck(
            command_id=command.id)))
        await eventually(lambda: _part_is(fleet, run.id, "team-a/west.eu",
                                          fleet_pb2.MEMBER_RUN_STATE_ACKNOWLEDGED))
        await member.close()


# -- the member's side ---------------------------------------------------------------------

def test_a_host_member_introduces_itself_with_its_namespace() -> None:
    member = HostMember(Client(MemoryTransport(SYSTEM_CLOCK)), "team-a", "west.eu",
                        host_id="host-1", annotations=dict)
    assert member.fleet_name == "team-a/west.eu"


def test_results_of_commands_from_before_namespaces_go_out_under_the_hubs_id() -> None:
    """A hub from before named a member by its FakeCluster's name alone; that hub's state is
    read with the member renamed, and so the member reports those commands' results under
    the new name, and takes their Jobs as its own."""
    reporting = Reporting("team-a/west", "west")
    sent: list[member_pb2.CommandResult] = []
    reporting.report = sent.append
    old = member_pb2.CommandResult(command_id="r1/west/start")
    [resynced] = reporting.resynced([old])
    assert resynced.command_id == "r1/team-a/west/start"
    reporting.update(old, {})  # unchanged: not sent again
    assert sent == []
    reporting.update(member_pb2.CommandResult(command_id="r1/west/start", verdict="Passed"), {})
    assert [r.command_id for r in sent] == ["r1/team-a/west/start"]
    # Ids of the new form, and those of another member, are left as they are.
    assert reporting.known_id("r2/team-a/west/start") == "r2/team-a/west/start"
    assert reporting.known_id("r2/east/start") == "r2/east/start"
    assert Reporting("west", "west").known_id("r1/west/start") == "r1/west/start"

    watching = JobWatching("team-a", "west", reporting=reporting, member_client=lambda: None,
                           worker_client=_no_worker, clock=SYSTEM_CLOCK)
    for command, ours in (("w1/team-a/west/job-0-1", True), ("w1/west/job-0-1", True),
                          ("w1/team-b/west/job-0-1", False), ("w1/east/job-0-1", False)):
        job = {"metadata": {"annotations": {keys.FLEET_COMMAND: command}}}
        assert (watching._command_of(job) == command) is ours, command


async def _no_worker(name: str) -> Client | None:
    return None


# -- bounds of what the member remembers -----------------------------------------------------

def test_what_was_reported_is_forgotten_once_its_object_is_gone() -> None:
    reporting = Reporting("west", "west")
    for command in ("r1/west/start", "r2/west/start", "w1/west/job-0-1"):
        reporting.send(member_pb2.CommandResult(command_id=command), "")
    reporting.retain({"r2/west/start"})
    assert list(reporting.reported) == ["r2/west/start"]


def test_refused_commands_kept_for_the_hello_are_bounded_newest_kept() -> None:
    reporting = Reporting("west", "west")
    for index in range(KEEP_REFUSED + 5):
        reporting.refuse(member_pb2.Command(id=f"w1/west/job-{index}-1"), "no")
    assert len(reporting.refused) == KEEP_REFUSED
    assert next(iter(reporting.refused)) == "w1/west/job-5-1"
    assert f"w1/west/job-{KEEP_REFUSED + 4}-1" in reporting.refused


# -- names as users write them -----------------------------------------------------------------

def test_a_name_without_namespace_is_the_one_member_of_that_name() -> None:
    membership = Membership(grace=6.0)
    for namespace, name in (("team-a", "west"), ("team-b", "west"), ("team-a", "east"),
                            ("default", "north"), ("team-c", "north")):
        membership.register(Identity(name=name, namespace=namespace), Inventory(), now=0.0)
    assert membership.resolve("east") == "team-a/east"
    assert membership.resolve("north") == "north", "namespace default's, when it has one"
    assert membership.resolve("team-b/west") == "team-b/west"
    assert membership.resolve("south") == "south", "none yet: one may register later"
    with pytest.raises(ValueError, match="'west' is the name of 2 members "
                                         "\\(team-a/west, team-b/west\\); write namespace/name"):
        membership.resolve("west")


async def test_users_name_a_member_alone_when_its_name_is_unique(tmp_path: Path) -> None:
    async with running_hub(tmp_path) as hub, hub.fleet() as fleet:
        raw = [RawMember(hub, name, namespace=namespace)
               for namespace, name in (("team-a", "west"), ("team-b", "west"),
                                       ("team-a", "east"))]
        for member in raw:
            await member.register()
        listed = await fleet.list_clusters(common_pb2.ClusterSelector(names=["east"]))
        assert [(m.cluster.namespace, m.cluster.name) for m in listed] == [("team-a", "east")]
        run = await fleet.run_plan(json.dumps(SPEC), common_pb2.ClusterSelector(
            names=["east", "team-b/west"]), start_delay=0)
        assert sorted(part.cluster for part in run.members) == ["team-a/east", "team-b/west"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await fleet.run_plan(json.dumps(SPEC), common_pb2.ClusterSelector(names=["west"]))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (refused.value.details() or "").startswith(
            "clusters.names[0]: 'west' is the name of 2 members (team-a/west, team-b/west)")
        for member in raw:
            await member.close()
