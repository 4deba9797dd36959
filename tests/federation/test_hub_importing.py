"""A fleet snapshot's hub state taken in as the hub starts: times shifted by the time since the
save, the restored members owned by the restoring host, a bad import set aside with why."""

from __future__ import annotations

import json
from pathlib import Path

from federation.client.discovery import HubFiles
from federation.hub import importing, shifting, store
from federation.hub.core import Hub, HubSettings
from federation.hub.membership import Identity, Member, State
from federation.hub.runs import MemberPart, Part, Run
from federation.hub.workloads import JobRecord, JobState, Settings, Workload
from tests.federation.hubs import HandClock

SAVED_AT = 1000.0


def saved() -> store.Snapshot:
    """A fleet at its save (t=1000): a run started at 990 whose member acknowledged it, and a
    workload with one Job running and one still to arrive at 1030."""
    west = Member(identity=Identity(name="west", host="old-host"), state=State.READY,
                  reason="SessionOpened", message="", registered_at=900.0, state_since=950.0,
                  last_heartbeat=999.0)
    elsewhere = Member(identity=Identity(name="east", host="other-host"),
                       state=State.READY, reason="", message="", registered_at=900.0,
                       state_since=900.0)
    run = Run(id="r1", name="n", plan="{}", selector={}, created_at=980.0, start_at=990.0,
              parts={"west": MemberPart(cluster="west", state=Part.RUNNING, sent_at=981.0,
                                        acknowledged_at=982.0)})
    settings = Settings(jobs=2, pods=1, resources={}, namespace="default", labels={},
                        priority_class="", queue="", placement="spread", selector={},
                        weights={}, manager="", seed=1, max_attempts=1)
    workload = Workload(
        id="w1", name="w", spec={}, settings=settings, created_at=985.0, start_at=990.0,
        samples=[[995.0, 1.0, 8.0]],
        jobs=[JobRecord(index=0, arrive_at=990.0, run_seconds=600.0, state=JobState.RUNNING,
                        cluster="west", sent_at=990.5, running_at=992.0, recovered_in=3.0),
              JobRecord(index=1, arrive_at=1030.0, run_seconds=600.0)])
    return store.Snapshot(hub_id="saved-hub", members=[west, elsewhere], runs=[run],
                          workloads=[workload])


def test_every_time_moves_by_the_time_since_the_save_and_not_yet_stays_not_yet() -> None:
    [workload] = [shifting.workload(w, 60.0) for w in saved().workloads]
    running, waiting = workload.jobs
    assert (workload.created_at, workload.start_at, workload.finished_at) == (1045.0, 1050.0, 0)
    assert workload.samples == [[1055.0, 1.0, 8.0]]
    # The Job due 30 s after the save is due 30 s after the restore.
    assert waiting.arrive_at - (SAVED_AT + 60.0) == 30.0
    assert (running.sent_at, running.running_at, running.finished_at) == (1050.5, 1052.0, 0.0)
    assert (running.run_seconds, running.recovered_in) == (600.0, 3.0)  # durations
    [run] = [shifting.run(r, 60.0) for r in saved().runs]
    assert (run.created_at, run.start_at, run.finished_at) == (1040.0, 1050.0, 0.0)
    assert (run.parts["west"].sent_at, run.parts["west"].acknowledged_at) == (1041.0, 1042.0)
    member = shifting.member(saved().members[0], 60.0)
    assert (member.registered_at, member.state_since, member.last_heartbeat) == \
        (960.0, 1010.0, 1059.0)


def test_the_restored_members_belong_to_the_restoring_host_and_the_hub_keeps_its_id() -> None:
    current = store.Snapshot(hub_id="this-hub", members=[
        Member(identity=Identity(name="local", host="new-host"), state=State.READY,
               reason="", message="", registered_at=1.0, state_since=1.0),
        Member(identity=Identity(name="west", host="new-host"), state=State.READY,
               reason="", message="", registered_at=1.0, state_since=1.0)], runs=[],
        workloads=[])
    merged = importing.merged(current, saved(), saved_at=SAVED_AT, now=1060.0,
                              host="new-host", restored={"west"})
    assert merged.hub_id == "this-hub"
    hosts = {member.name: member.identity.host for member in merged.members}
    # east was not restored here: its own host may come back to this hub for it.
    assert hosts == {"west": "new-host", "east": "other-host", "local": "new-host"}
    assert merged.members[0].registered_at == 960.0  # the saved west, shifted
    assert [run.id for run in merged.runs] == ["r1"]
    assert merged.workloads[0].jobs[1].arrive_at == 1090.0


async def test_a_starting_hub_takes_the_import_in_and_stores_it(tmp_path: Path) -> None:
    files = HubFiles(tmp_path)
    files.restore.write_text(json.dumps({"state": store.encode(saved()), "savedAt": SAVED_AT,
                                         "host": "new-host", "members": ["west"]}))
    clock = HandClock(at=1060.0)
    hub = Hub(HubSettings(state_dir=tmp_path, fsync=False), clock=clock)
    await hub.start()
    try:
        assert not files.restore.exists()
        assert hub.dispatching.workloads["w1"].jobs[1].arrive_at == 1090.0
        assert hub.running.runs["r1"].start_at == 1050.0
        assert hub.membership.members["west"].identity.host == "new-host"
        stored = store.decode(json.loads(files.state.read_text()))
        assert stored.workloads[0].start_at == 1050.0
        assert stored.hub_id == hub.hub_id != "saved-hub"
    finally:
        await hub.stop()


async def test_an_import_the_hub_cannot_read_is_set_aside_and_the_hub_keeps_its_state(
        tmp_path: Path) -> None:
    files = HubFiles(tmp_path)
    files.restore.write_text(json.dumps({"state": {"format": 99}, "savedAt": SAVED_AT,
                                         "host": "h", "members": []}))
    hub = Hub(HubSettings(state_dir=tmp_path, fsync=False), clock=HandClock())
    await hub.start()
    try:
        assert not files.restore.exists()
        refused = json.loads(files.refused.read_text())
        assert str(files.restore) in refused["refused"]
        assert "state format 99" in refused["refused"]
        assert hub.dispatching.workloads == {}
    finally:
        await hub.stop()
