"""The snapshot file: versioned, checksummed, compressed, readable by any later fakefleet.

A snapshot is one file anyone can copy::

    fakefleet-snapshot\\n                the magic line
    {"format": 1, ...}\\n                the header (JSON, one line): what it holds, when it was
                                         taken, whether it has secrets, the payload's size and
                                         SHA-256
    <gzip>                               the payload: JSON of the clusters

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
#: would misread takes a new number, and the reader learns to read the old one.
FORMAT = 1


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
    """Clusters read at one etcd revision."""

    saved_at: float
    revision: int
    secrets: bool
    clusters: tuple[ClusterSnapshot, ...]


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


def encode(snapshot: Snapshot, *, created_at: str) -> bytes:
    """The file's bytes."""
    payload = json.dumps({"clusters": [_cluster_json(cluster) for cluster in snapshot.clusters]},
                         separators=(",", ":")).encode()
    return framing.encode(KIND, {
        "createdAt": created_at, "savedAt": snapshot.saved_at, "revision": snapshot.revision,
        "clusters": [c.member for c in snapshot.clusters], "secrets": snapshot.secrets,
        "keys": sum(len(c.keys) for c in snapshot.clusters)}, payload)


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
    except (ValueError, KeyError, TypeError) as error:
        raise framing.unreadable(KIND, path, error) from error
    return header, Snapshot(saved_at=header.savedAt, revision=header.revision,
                            secrets=header.secrets, clusters=clusters)


def _typed(path: Path, raw: dict[str, Any]) -> Header:
    try:
        return Header(**{field.name: raw[field.name] for field in dataclasses.fields(Header)})
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
