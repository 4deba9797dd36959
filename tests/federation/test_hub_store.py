"""The hub's state file: what is written is every field of every member and run, and reads
back as it was."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from federation.hub import store
from federation.hub.membership import Identity, Inventory, Member, Pool, State
from federation.hub.runs import MemberPart, Part, Run
from tests.fakes.clocks import FakeClock


def snapshot() -> store.Snapshot:
    member = Member(
        identity=Identity(name="west", host="h1", labels={"gpu": "h100"},
                          kubernetes_version="v1.36.3", endpoint="https://127.0.0.1:6443"),
        state=State.READY, reason="SessionOpened", message="session open", registered_at=1.5,
        state_since=2.5, last_heartbeat=3.5,
        inventory=Inventory(pools=(Pool(name="gpu", ready=7, total=8,
                                        allocatable={"nvidia.com/gpu": "8"}),),
                            nodes_ready=7, nodes_total=8, allocatable={"nvidia.com/gpu": "64"},
                            pods_by_phase={"Running": 3}))
    part = MemberPart(cluster="west", state=Part.RUNNING, verdict="", steps_done="0/1",
                      message="m", object="FaultPlan default/x", sent_at=4.0,
                      acknowledged_at=4.5, finished_at=0.0, stop_acknowledged=True)
    run = Run(id="r1", name="n", plan="{}", selector={"names": ["west"]}, created_at=4.0,
              start_at=6.0, parts={"west": part}, cancelled=True, finished_at=0.0)
    return store.Snapshot(hub_id="h", members=[member], runs=[run])


def test_every_field_is_written_as_dataclasses_would_write_it() -> None:
    written = store.encode(snapshot())
    [member], [run] = snapshot().members, snapshot().runs
    expected_inventory: dict[str, Any] = dataclasses.asdict(member.inventory)
    expected_inventory["pools"] = list(expected_inventory["pools"])
    assert written["members"][0]["identity"] == dataclasses.asdict(member.identity)
    assert written["members"][0]["inventory"] == expected_inventory
    assert written["runs"][0]["parts"] == [dataclasses.asdict(run.parts["west"])
                                           | {"state": "Running"}]


def test_what_is_written_reads_back_as_it_was() -> None:
    assert store.decode(store.encode(snapshot())) == snapshot()


async def test_writes_are_paced_by_what_encoding_costs(tmp_path: Path) -> None:
    """Changes keep coming while a slow state is written: the store leaves the loop free for
    PACE times the encoding between writes, and each commit still returns once it is on disk."""
    encodings: list[tuple[float, float]] = []

    def slow_snapshot() -> store.Snapshot:
        started = time.monotonic()
        time.sleep(0.02)  # a large state
        encodings.append((started, time.monotonic()))
        return snapshot()

    state = store.Store(tmp_path / "state.json", fsync=False)
    state.start(slow_snapshot)
    try:
        for _ in range(40):
            state.changed()
            await asyncio.sleep(0.01)
        await state.commit()
    finally:
        await state.stop()
    assert store.decode(json.loads((tmp_path / "state.json").read_text())) == snapshot()
    assert len(encodings) >= 3
    for (started, ended), (following, _) in itertools.pairwise(encodings):
        assert following - ended >= 0.95 * store.PACE * (ended - started)


def test_old_finished_runs_are_forgotten_within_both_bounds(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from federation.hub import core, running

    monkeypatch.setattr(running, "KEEP_RUNS", 3)
    monkeypatch.setattr(running, "KEEP_PARTS", 5)
    hub = core.Hub(core.HubSettings(state_dir=tmp_path))

    def run(number: int, members: int, finished: bool) -> Run:
        parts = {f"m{i}": MemberPart(cluster=f"m{i}", state=Part.SUCCEEDED if finished
                                     else Part.RUNNING) for i in range(members)}
        return Run(id=f"r{number}", name="", plan="{}", selector={}, created_at=float(number),
                   start_at=0.0, parts=parts, finished_at=float(number) if finished else 0.0)

    for item in (run(1, 1, True), run(2, 2, True), run(3, 2, True), run(4, 1, True),
                 run(5, 9, False)):
        hub.running.runs[item.id] = item
    hub.running.forget_old_runs()
    # Newest first: r4 (1 part), r3 (2), r2 (2) make 5 parts; r1 goes. The running one stays.
    assert sorted(hub.running.runs) == ["r2", "r3", "r4", "r5"]
    monkeypatch.setattr(running, "KEEP_RUNS", 1)
    hub.running.forget_old_runs()
    assert sorted(hub.running.runs) == ["r4", "r5"]


# -- a writer that fails ------------------------------------------------------------------------

async def test_a_commit_fails_fast_when_the_writer_fails_and_succeeds_once_it_is_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A defect in the writer (here: the state cannot be encoded) is logged with its
    traceback; meanwhile a commit fails at once instead of waiting for a write that will not
    come, and the writer, started again after a back-off, writes what was pending."""
    clock = FakeClock()
    broken = True

    def state() -> store.Snapshot:
        if broken:
            raise TypeError("cannot encode a member")
        return snapshot()

    writer = store.Store(tmp_path / "state.json", fsync=False, clock=clock)
    writer.start(state)
    try:
        with caplog.at_level(logging.ERROR, logger="primitives.tasks"):
            async with asyncio.timeout(5):
                with pytest.raises(store.StoreError, match="cannot encode a member"):
                    await writer.commit()
        assert any("hub-store failed" in r.getMessage() and r.exc_info is not None
                   for r in caplog.records)
        assert not (tmp_path / "state.json").exists()
        broken = False
        await clock.advance(store.WRITE_RETRY)  # the writer starts again
        async with asyncio.timeout(5):
            await writer.commit()
        assert store.decode(json.loads((tmp_path / "state.json").read_text())) == snapshot()
    finally:
        await writer.stop()


async def test_a_commit_never_waits_for_a_writer_that_stopped(tmp_path: Path) -> None:
    writer = store.Store(tmp_path / "state.json", fsync=False)
    writer.start(snapshot)
    assert writer._task is not None
    writer._task.cancel()  # the writer is gone (as a crash of the supervisor would leave it)
    await asyncio.sleep(0)
    async with asyncio.timeout(5):
        with pytest.raises(store.StoreError, match="its writer is not running"):
            await writer.commit()
    await writer.stop()


# -- format 1: members named by their FakeCluster's name alone ----------------------------------

def test_a_format_1_state_reads_with_every_member_in_its_namespace() -> None:
    """What the hub of format 1 meant: a member was its FakeCluster's name alone, and its
    operator's host id ended in the FakeCluster's namespace."""
    old = store.encode(snapshot())
    old["format"] = 1
    member = old["members"][0]
    del member["identity"]["namespace"]
    member["identity"]["host"] = "node-1:/var/lib/fakefleet:team-a"
    simulated = json.loads(json.dumps(member))
    simulated["identity"] |= {"name": "east", "host": "simulator"}
    old["members"].append(simulated)
    old["workloads"] = [{
        "id": "w1", "name": "", "spec": {}, "createdAt": 1.0, "startAt": 1.0, "finishedAt": 0.0,
        "samples": [], "sampleEvery": 1.0, "lastTurn": "west", "traceparent": "",
        "settings": {"jobs": 1, "pods": 1, "resources": {}, "namespace": "default",
                     "labels": {}, "priority_class": "", "queue": "", "placement": "weighted",
                     "selector": {"names": ["west", "east"]}, "weights": {"west": 2.0},
                     "manager": "", "seed": 0, "max_attempts": 1},
        "jobs": [{"index": 0, "arrive_at": 1.0, "run_seconds": 5.0, "state": "Placed",
                  "cluster": "west", "avoid": "east"}]}]

    read = store.decode(json.loads(json.dumps(old)))

    west, east = read.members
    assert (west.identity.namespace, west.name, west.identity.host) == \
        ("team-a", "team-a/west", "")
    assert (east.identity.namespace, east.name) == ("default", "east")
    [run] = read.runs
    assert list(run.parts) == ["team-a/west"]
    assert run.parts["team-a/west"].cluster == "team-a/west"
    assert run.selector["names"] == ["team-a/west"]
    [workload] = read.workloads
    assert workload.settings.selector["names"] == ["team-a/west", "east"]
    assert workload.settings.weights == {"team-a/west": 2.0}
    assert (workload.jobs[0].cluster, workload.jobs[0].avoid) == ("team-a/west", "east")
    assert workload.last_turn == "team-a/west"
    # Written again, it is format 2 and reads back as it is.
    again = store.encode(read)
    assert again["format"] == store.FORMAT == 2
    assert store.decode(again) == read
