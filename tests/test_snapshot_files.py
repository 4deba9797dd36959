"""The snapshot file: round trip, version check, truncation, corruption, and where it is kept."""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import pytest

from operators.api.restores import RestoreHold, held, read_hold
from operators.controlplane.etcd import EtcdEndpoint, KeyValue
from operators.controlplane.state import StateDir
from operators.snapshots import encoding, restoring, saving, storing
from operators.snapshots.encoding import ClusterSnapshot, Snapshot, SnapshotError
from operators.snapshots.shifting import shift
from primitives import keys
from tests.fakes.clocks import FakeClock

CLUSTER = ClusterSnapshot(
    namespace="default", name="west",
    keys=((b"pods/default/a", b"k8s\x00\x0a\x09binary"), (b"secrets/default/s", b"\xff\x00")),
    fake_cluster={"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                  "metadata": {"name": "west", "namespace": "default", "uid": "u"},
                  "spec": {"kubernetesVersion": "v1.33.0"}},
    pools=({"metadata": {"name": "gpu"}, "spec": {"clusterRef": "west", "replicas": 2}},),
    plans=({"metadata": {"name": "p"}, "spec": {},
            "status": {"startedAt": "2026-01-01T00:00:00Z"}},),
    pki=(("pki/ca.crt", b"-----BEGIN CERTIFICATE-----"),))
SNAPSHOT = Snapshot(saved_at=1_800_000_000.5, revision=42, secrets=True, clusters=(CLUSTER,))


def saved(tmp_path: Path, data: bytes | None = None) -> Path:
    path = storing.path_of(tmp_path, "before")
    storing.write(path, encoding.encode(SNAPSHOT, created_at="2027-01-15T08:00:00Z")
                  if data is None else data)
    return path


def test_a_snapshot_reads_back_as_it_was_written(tmp_path: Path) -> None:
    header, read = encoding.read(saved(tmp_path))
    assert read == SNAPSHOT
    assert header.clusters == ["default/west"]
    assert header.keys == 2
    assert header.secrets
    assert header.format == encoding.FORMAT
    assert header.revision == 42


def test_it_is_private_and_listed_with_its_mode(tmp_path: Path) -> None:
    path = saved(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    [listed] = storing.listing(tmp_path)
    assert listed.name == "before"
    assert listed.mode == 0o600
    assert listed.header is not None
    assert listed.header.createdAt == "2027-01-15T08:00:00Z"


def test_a_later_format_is_refused_with_the_version_that_wrote_it(tmp_path: Path) -> None:
    data = encoding.encode(SNAPSHOT, created_at="x")
    header_end = data.index(b"\n", len(encoding.MAGIC))
    header = json.loads(data[len(encoding.MAGIC):header_end])
    header.update(format=encoding.FORMAT + 1, writtenBy="9.9.9")
    path = saved(tmp_path, encoding.MAGIC + json.dumps(header).encode() + data[header_end:])
    with pytest.raises(SnapshotError, match=rf"{path}.*format {encoding.FORMAT + 1}, written "
                                            r"by fakefleet 9\.9\.9"
                                            r".*restore it with that fakefleet or a later one"):
        encoding.read(path)


def test_a_fleet_snapshot_reads_back_with_the_hubs_state(tmp_path: Path) -> None:
    hub = {"format": 2, "hubId": "h", "members": [{"identity": {"name": "west"}}],
           "runs": [], "workloads": [{"id": "w1"}]}
    fleet = dataclasses.replace(SNAPSHOT, hub=hub, hub_at_revision=True)
    path = saved(tmp_path, encoding.encode(fleet, created_at="x"))
    header, read = encoding.read(path)
    assert read == fleet
    assert header.hub
    assert header.hubAtRevision
    assert read.hub_counts() == "1 members, 0 runs, 1 workloads"
    assert encoding.read_header(saved(tmp_path)).hub is False


@pytest.mark.parametrize("stored_meanwhile", [False, True])
async def test_the_hubs_state_is_read_after_etcd_and_said_at_the_revision_if_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stored_meanwhile: bool) -> None:
    """The hub's file is read before and after the etcd read; the one after is saved, and it
    is the state at the revision only if the hub stored nothing in between."""
    hub = tmp_path / "state.json"
    hub.write_text(json.dumps({"format": 2, "runs": []}))

    async def read_prefixes(etcd: EtcdEndpoint,
                            prefixes: list[str]) -> tuple[int, dict[str, list[KeyValue]]]:
        if stored_meanwhile:
            hub.write_text(json.dumps({"format": 2, "runs": [{"id": "r1"}]}))
        found: dict[str, list[KeyValue]] = {prefix: [] for prefix in prefixes}
        found[saving.host_prefix("fakeclusters", "default")] = [
            (b"west", json.dumps(CLUSTER.fake_cluster).encode())]
        found[saving.member_prefix("default", "west")] = [CLUSTER.keys[0]]
        return 7, found

    monkeypatch.setattr(saving, "read_prefixes", read_prefixes)
    taken = await saving.save(etcd=None, state=StateDir(tmp_path),  # type: ignore[arg-type]
                              members=[("default", "west")], secrets=False, clock=FakeClock(),
                              hub=hub)
    assert taken.hub == json.loads(hub.read_text())
    assert taken.hub_at_revision is not stored_meanwhile
    hub.unlink()
    with pytest.raises(SnapshotError, match=rf"no state at {hub}.*--without-hub"):
        await saving.save(etcd=None, state=StateDir(tmp_path),  # type: ignore[arg-type]
                          members=[("default", "west")], secrets=False, clock=FakeClock(),
                          hub=hub)


def test_a_format_1_snapshot_reads_as_one_without_the_hub(tmp_path: Path) -> None:
    """What the first fakefleet with snapshots wrote: no hub in its header nor its payload."""
    data = encoding.encode(SNAPSHOT, created_at="x")
    header_end = data.index(b"\n", len(encoding.MAGIC))
    header = json.loads(data[len(encoding.MAGIC):header_end])
    del header["hub"]
    header["format"] = 1
    path = saved(tmp_path, encoding.MAGIC + json.dumps(header).encode() + data[header_end:])
    read_header, read = encoding.read(path)
    assert (read_header.format, read_header.hub) == (1, False)
    assert read == SNAPSHOT
    assert read.hub is None


def test_the_hubs_part_names_the_members_as_the_fleet_does() -> None:
    east = dataclasses.replace(CLUSTER, namespace="team", name="east")
    fleet = dataclasses.replace(SNAPSHOT, clusters=(CLUSTER, east), hub={"format": 2})
    taken = json.loads(restoring.hub_import(fleet, host="here-1234"))
    assert taken == {"state": {"format": 2}, "savedAt": SNAPSHOT.saved_at, "host": "here-1234",
                     "members": ["west", "team/east"]}


def test_a_truncated_copy_names_the_file_and_the_fix(tmp_path: Path) -> None:
    path = saved(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(SnapshotError, match=rf"{path} is truncated.*copy the whole file again"):
        encoding.read(path)


def test_a_copy_cut_inside_its_header_or_of_no_format_names_the_file_and_the_fix(
        tmp_path: Path) -> None:
    path = saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:len(encoding.MAGIC) + 20])
    with pytest.raises(SnapshotError, match=rf"{path} is truncated inside its header: copy the "
                                            r"whole file again"):
        encoding.read_header(path)
    header_end = data.index(b"\n", len(encoding.MAGIC))
    header = json.loads(data[len(encoding.MAGIC):header_end]) | {"format": 0}
    path.write_bytes(encoding.MAGIC + json.dumps(header).encode() + data[header_end:])
    with pytest.raises(SnapshotError, match=rf"{path} has format 0, which no fakefleet wrote: "
                                            r"give a file that 'fakefleet snapshot save' wrote"):
        encoding.read(path)


def test_a_corrupted_copy_fails_its_checksum(tmp_path: Path) -> None:
    path = saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(SnapshotError, match=rf"{path} is corrupted: its payload's SHA-256"):
        encoding.read(path)


def test_a_file_that_is_no_snapshot_says_so(tmp_path: Path) -> None:
    path = tmp_path / "notes.snapshot"
    path.write_text("hello\n")
    with pytest.raises(SnapshotError, match="is not a fakefleet snapshot"):
        encoding.read(path)
    [] = storing.listing(tmp_path)
    with pytest.raises(SnapshotError, match="no snapshot at"):
        encoding.read(tmp_path / "missing.snapshot")


def test_names_and_paths(tmp_path: Path) -> None:
    assert storing.locate(tmp_path, "before") == tmp_path / "snapshots" / "before.snapshot"
    assert storing.locate(tmp_path, "./copy.snapshot") == Path("./copy.snapshot")
    with pytest.raises(SnapshotError, match="'Before!' is not a DNS subdomain"):
        storing.path_of(tmp_path, "Before!")
    saved(tmp_path)
    storing.remove(tmp_path, "before")
    with pytest.raises(SnapshotError, match="no snapshot named 'before'"):
        storing.remove(tmp_path, "before")


def test_times_move_by_the_shift_and_keep_their_precision() -> None:
    status = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
              "conditions": [{"type": "Ready", "lastTransitionTime": "2026-01-01T00:00:05Z",
                              "lastProbeTime": None}],
              "containerStatuses": [{"name": "c", "state": {"running": {
                  "startedAt": "2026-01-01T00:00:05Z"}}}],
              "message": "2026-01-01T00:00:00Z is not under a time key"}
    moved = shift(status, 3600)
    assert moved["startTime"] == "2026-01-01T01:00:00Z"
    assert moved["conditions"][0] == {"type": "Ready", "lastProbeTime": None,
                                      "lastTransitionTime": "2026-01-01T01:00:05Z"}
    assert moved["containerStatuses"][0]["state"]["running"]["startedAt"] == \
        "2026-01-01T01:00:05Z"
    assert moved["message"] == status["message"]
    assert shift({"renewTime": "2026-01-01T00:00:00.250000Z"}, -1) == \
        {"renewTime": "2025-12-31T23:59:59.250000Z"}
    assert shift({"injectedAt": ""}, 10) == {"injectedAt": ""}


def test_a_restore_hold_reads_back_and_an_unreadable_one_holds_everything() -> None:
    hold = RestoreHold("123", ("kube-apiserver",))
    assert read_hold({keys.RESTORE: hold.render()}) == hold
    assert hold.token == "123:kube-apiserver"
    assert read_hold({keys.RESTORE: "{not json"}) == RestoreHold("unreadable", ())
    assert read_hold({keys.RESTORE: '{"id": "1", "run": ["kube-scheduler"]}'}) == \
        RestoreHold("1", ())
    assert read_hold({}) is None
    assert held({keys.RESTORE_HELD: "1:"}) == "1:"
