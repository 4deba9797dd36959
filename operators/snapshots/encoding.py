"""The snapshot file: versioned, checksummed, compressed, readable by any later fakefleet.

A snapshot is one file anyone can copy::

    fakefleet-snapshot\\n                the magic line
    {"format": 2, ...}\\n                the header (JSON, one line): what it holds, when it was
                                         taken, whether it has secrets, the payload's size and
                                         SHA-256
    <gzip>                               the payload: JSON of the clusters (and of the hub's
                                         state, for a fleet)

``snapshot ls`` reads the header alone. A reader checks the header's format (a later format is
refused with the version that wrote it; each earlier one is read as it was written), the
payload's length (a truncated copy) and its checksum (a corrupted one) before it decodes
anything, and every error names the file and what to do: the framing is
:mod:`primitives.framing`, shared with traces. This module says what a snapshot's header and
payload hold.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path
from typing import Any

from operators.controlplane.errors import ControlPlaneError
from primitives import framing

MAGIC = b"fakefleet-snapshot\n"
#: The format this fakefleet writes, and the latest it reads. A change that an older reader
#: would misread takes a new number, and the reader learns to read the old one. Format 2 adds
#: the hub's state, which a format-1 reader would drop without a word; a format-1 file reads
#: as a snapshot without it.
FORMAT = 2


class SnapshotError(ControlPlaneError):
    """A snapshot cannot be read, written, saved or restored; the message names the file."""


#: The framing (:mod:`primitives.framing`) every snapshot file has.
KIND = framing.Kind(magic=MAGIC, noun="snapshot", format=FORMAT,
                    writer="'fakefleet snapshot save'",
                    when_missing="'fakefleet snapshot ls' lists the saved ones",
                    use="restore it", error=SnapshotError)


@dataclasses.dataclass(frozen=True)
class ClusterSnapshot:
    """One FakeCluster at the snapshot's revision."""

    namespace: str
    name: str
    #: Every key of the member's etcd prefix, relative to it, with its value as etcd holds it.
    keys: tuple[tuple[bytes, bytes], ...]
    #: The FakeCluster, its FakeNodePools and the FaultPlans of its namespace, as the host API
    #: served them (metadata trimmed to what a create takes; status kept).
    fake_cluster: dict[str, Any]
    pools: tuple[dict[str, Any], ...] = ()
    plans: tuple[dict[str, Any], ...] = ()
    #: The member's certificates and keys (its CA, service-account key, front proxy), by path
    #: relative to the cluster's state directory; empty without secrets.
    pki: tuple[tuple[str, bytes], ...] = ()

    @property
    def member(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Clusters read at one etcd revision, and the hub's state read just after it."""

    saved_at: float
    revision: int
    secrets: bool
    clusters: tuple[ClusterSnapshot, ...]
    #: The federation hub's members, runs and workloads, as its ``state.json`` held them (the
    #: hub's own format, which only the hub reads); None: not saved.
    hub: dict[str, Any] | None = None
    #: Whether the hub's stored state was the same before and after the etcd read: then it is
    #: the one it had at the revision; else the one after, a little ahead of the members.
    hub_at_revision: bool = False

    def hub_counts(self) -> str:
        """What the hub's state holds, for people."""
        hub = self.hub or {}
        return ", ".join(f"{len(hub.get(part) or [])} {part}"
                         for part in ("members", "runs", "workloads"))


@dataclasses.dataclass(frozen=True)
class Header:
    """What ``snapshot ls`` shows, read without the payload."""

    format: int
    createdAt: str
    savedAt: float
    revision: int
    clusters: list[str]
    secrets: bool
    writtenBy: str
    keys: int
    payloadBytes: int
    sha256: str
    #: Whether it holds the hub's state (format 1 never did), and whether that is the state
    #: the hub had at the revision (Snapshot.hub_at_revision).
    hub: bool = False
    hubAtRevision: bool = False


def encode(snapshot: Snapshot, *, created_at: str) -> bytes:
    """The file's bytes."""
    body: dict[str, Any] = {"clusters": [_cluster_json(c) for c in snapshot.clusters]}
    if snapshot.hub is not None:
        body["hub"] = snapshot.hub
    return framing.encode(KIND, {
        "createdAt": created_at, "savedAt": snapshot.saved_at, "revision": snapshot.revision,
        "clusters": [c.member for c in snapshot.clusters], "secrets": snapshot.secrets,
        "keys": sum(len(c.keys) for c in snapshot.clusters), "hub": snapshot.hub is not None,
        "hubAtRevision": snapshot.hub_at_revision},
        json.dumps(body, separators=(",", ":")).encode())


def read_header(path: Path) -> Header:
    """The header of the snapshot at ``path`` (the payload is not read)."""
    return _typed(path, framing.read_header(KIND, path))


def read(path: Path) -> tuple[Header, Snapshot]:
    """The snapshot at ``path``, checked whole before it is decoded."""
    raw, payload = framing.read(KIND, path)
    header = _typed(path, raw)
    try:
        body = json.loads(payload)
        clusters = tuple(_cluster(item) for item in body["clusters"])
        hub = body.get("hub")
        if hub is not None and not isinstance(hub, dict):
            raise TypeError(f"its hub state is a {type(hub).__name__}, not an object")
    except (ValueError, KeyError, TypeError) as error:
        raise framing.unreadable(KIND, path, error) from error
    return header, Snapshot(saved_at=header.savedAt, revision=header.revision,
                            secrets=header.secrets, clusters=clusters, hub=hub,
                            hub_at_revision=header.hubAtRevision)


def _typed(path: Path, raw: dict[str, Any]) -> Header:
    try:
        return Header(**{field.name: raw[field.name] for field in dataclasses.fields(Header)
                         if field.name in raw or field.default is dataclasses.MISSING})
    except KeyError as error:
        raise SnapshotError(f"snapshot {path}'s header lacks {error}: copy it again from where "
                            f"it was saved") from error


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _cluster_json(cluster: ClusterSnapshot) -> dict[str, Any]:
    return {
        "namespace": cluster.namespace, "name": cluster.name,
        "keys": [[_b64(key), _b64(value)] for key, value in cluster.keys],
        "fakeCluster": cluster.fake_cluster, "pools": list(cluster.pools),
        "plans": list(cluster.plans),
        "pki": {path: _b64(data) for path, data in cluster.pki},
    }


def _cluster(raw: dict[str, Any]) -> ClusterSnapshot:
    return ClusterSnapshot(
        namespace=str(raw["namespace"]), name=str(raw["name"]),
        keys=tuple((base64.b64decode(key), base64.b64decode(value))
                   for key, value in raw["keys"]),
        fake_cluster=dict(raw["fakeCluster"]), pools=tuple(raw["pools"]),
        plans=tuple(raw["plans"]),
        pki=tuple((str(path), base64.b64decode(data)) for path, data in raw["pki"].items()))
