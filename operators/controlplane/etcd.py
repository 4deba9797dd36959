"""The shared etcd as fakefleet reaches it: where its files are in the state directory, how a
client connects to it, and the calls fakefleet makes to it (count and delete a key prefix; read
prefixes at one revision and replace one, for snapshots; read, and clear, its alarms).

etcd speaks TLS only, and only to clients that present a certificate of its own CA: the
kube-apiservers with theirs, fakefleet with its own. A local user without access to the state
directory reads nothing from it, not even over loopback. Every module that needs one of etcd's
files or its address asks here, so the layout is spelled once::

    <state>/etcd/data/        etcd's data; survives restarts
    <state>/etcd/ports.json   its client and peer ports (its peer URL is in its data)
    <state>/etcd/pki/         its CA; serving, peer and client certificates (see pki.EtcdPKI)
    <state>/etcd/etcd.log

This module starts nothing: :mod:`~operators.controlplane.substrate` runs etcd.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import ssl
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from operators.controlplane import components, health
from operators.controlplane.components import EtcdPorts
from operators.controlplane.errors import StateError
from operators.controlplane.pki import EtcdPKI
from primitives.files import write_private

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EtcdFiles:
    """Where the shared etcd of one state directory keeps its files."""

    directory: Path

    @classmethod
    def of(cls, state_dir: Path) -> EtcdFiles:
        return cls(state_dir / "etcd")

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def ports_file(self) -> Path:
        return self.directory / "ports.json"

    @property
    def log_path(self) -> Path:
        return self.directory / "etcd.log"

    @property
    def pki(self) -> EtcdPKI:
        return EtcdPKI(self.directory / "pki")


@dataclasses.dataclass(frozen=True)
class EtcdEndpoint:
    """How fakefleet reaches an etcd: its client URL and the PKI of its client certificate."""

    url: str
    pki: EtcdPKI

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    def tls(self) -> ssl.SSLContext:
        """Verifies etcd against its CA and presents fakefleet's client certificate."""
        return health.client_tls(
            self.pki.ca_cert, self.pki.fakefleet_client_cert, self.pki.fakefleet_client_key
        )


def read_ports(files: EtcdFiles) -> EtcdPorts | None:
    """The ports an earlier run used, or None if etcd never ran here."""
    try:
        stored = json.loads(files.ports_file.read_text())
        return EtcdPorts(client=int(stored["client"]), peer=int(stored["peer"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):  # cut short by a crash: choose ports anew
        logger.warning("%s is unreadable; choosing new ports", files.ports_file)
        return None


def write_ports(files: EtcdFiles, ports: EtcdPorts) -> None:
    # Written aside and renamed: a crash leaves the old file or the new one, never half.
    write_private(files.ports_file, (json.dumps(dataclasses.asdict(ports)) + "\n").encode())


def shared_etcd(state_dir: Path) -> EtcdEndpoint:
    """How to reach the etcd that the substrate in ``state_dir`` runs."""
    files = EtcdFiles.of(state_dir)
    ports = read_ports(files)
    if ports is None:
        raise StateError(f"no shared etcd in {state_dir}: start it with 'fakefleet up'")
    missing = [path for path in (files.pki.ca_cert, files.pki.fakefleet_client_cert,
                                 files.pki.fakefleet_client_key) if not path.exists()]
    if missing:
        raise StateError(f"the shared etcd in {state_dir} has no client credentials "
                         f"({', '.join(str(path) for path in missing)} missing): restart it "
                         f"with 'fakefleet down' and 'fakefleet up'")
    return EtcdEndpoint(components.etcd_client_url(ports), files.pki)


async def count_etcd_keys(etcd: EtcdEndpoint, prefix: str) -> int:
    """How many keys etcd holds under ``prefix`` (through etcd's JSON gateway)."""
    body = await _range_call(etcd, "/v3/kv/range", prefix, count_only=True)
    return int(body.get("count", 0))


async def delete_etcd_prefix(etcd: EtcdEndpoint, prefix: str) -> int:
    """Delete every key under ``prefix``; returns how many were deleted."""
    body = await _range_call(etcd, "/v3/kv/deleterange", prefix)
    return int(body.get("deleted", 0))


#: etcd raises this alarm when its database reaches its quota (``--quota-backend-bytes``, 2 GiB
#: by default); from then on it refuses every write, so every member's API server fails
#: writes. It stays raised until someone frees space and disarms it.
NOSPACE = "NOSPACE"


async def etcd_alarms(etcd: EtcdEndpoint) -> list[str]:
    """The alarms etcd has raised (``NOSPACE``, ``CORRUPT``), each once; none when etcd does
    not answer (its health probe says that)."""
    try:
        body = await _call(etcd, "/v3/maintenance/alarm", {"action": "GET"})
    except (aiohttp.ClientError, TimeoutError, OSError):
        return []
    return sorted({alarm.get("alarm", "") for alarm in body.get("alarms") or ()} - {""})


def alarm_message(alarms: list[str]) -> str:
    """What ``fakefleet status`` says of raised alarms ("" for none)."""
    if not alarms:
        return ""
    if NOSPACE in alarms:
        return ("NOSPACE alarm: etcd's database is full and it refuses every write; delete "
                "FakeClusters you no longer need, then run 'fakefleet etcd disarm'")
    return f"alarm {', '.join(alarms)}: see etcd.log in the state directory"


@dataclasses.dataclass(frozen=True)
class Disarmed:
    """What :func:`disarm_etcd` did: the database's size before and after, and the alarms it
    cleared."""

    size_before: int
    size_after: int
    alarms: list[str]


async def disarm_etcd(etcd: EtcdEndpoint) -> Disarmed:
    """Free what etcd holds of old revisions and clear its alarms: compact to the current
    revision, defragment, then disarm every alarm (what etcd's own docs prescribe for
    NOSPACE). Space the live keys take is not freed: that takes deleting them."""
    before = await _call(etcd, "/v3/maintenance/status", {})
    revision = int((before.get("header") or {}).get("revision", 0))
    if revision:
        await _call(etcd, "/v3/kv/compaction", {"revision": revision, "physical": True},
                    compacted_ok=True)
    await _call(etcd, "/v3/maintenance/defragment", {})
    raised = (await _call(etcd, "/v3/maintenance/alarm", {"action": "GET"})).get("alarms") or []
    for alarm in raised:
        await _call(etcd, "/v3/maintenance/alarm", {"action": "DEACTIVATE", **alarm})
    after = await _call(etcd, "/v3/maintenance/status", {})
    return Disarmed(int(before.get("dbSize", 0)), int(after.get("dbSize", 0)),
                    sorted({alarm.get("alarm", "") for alarm in raised} - {""}))


#: Keys per page of a snapshot's read: small enough that a page of large objects stays far
#: below the gateway's message limit, large enough that 15,000 keys take 30 round trips.
RANGE_PAGE = 500
#: A write batch stays under etcd's defaults (--max-txn-ops 128, --max-request-bytes 1.5 MiB).
TXN_OPS = 100
TXN_BYTES = 1 << 20

#: A key and its value, as etcd holds them.
KeyValue = tuple[bytes, bytes]


class CompactedError(StateError):
    """The revision a read asked for was compacted away while it ran."""


async def read_prefixes(etcd: EtcdEndpoint, prefixes: Sequence[str], *,
                        page: int = RANGE_PAGE) -> tuple[int, dict[str, list[KeyValue]]]:
    """Every key under each of ``prefixes`` (relative to it) and its value, all read at one
    revision (the first page's), which is returned too. Keys bound to an etcd lease (Events,
    an API server's own endpoint lease) are left out: they are ephemeral, and expire on their
    own. CompactedError if the revision is compacted before the read ends (API servers compact
    every 5 minutes): reading again starts at a new one."""
    revision = 0
    found: dict[str, list[KeyValue]] = {}
    with _failing(etcd, "read"):
        async with aiohttp.ClientSession() as session:
            for prefix in prefixes:
                start, end = _range(prefix)
                kvs: list[KeyValue] = []
                while True:
                    payload: dict[str, Any] = {"key": _b64(start), "range_end": _b64(end),
                                               "limit": page}
                    if revision:
                        payload["revision"] = revision
                    body = await _post(session, etcd, "/v3/kv/range", payload)
                    revision = revision or int(body["header"]["revision"])
                    got = body.get("kvs") or []
                    kvs += [(base64.b64decode(kv["key"])[len(prefix):],
                             base64.b64decode(kv.get("value", ""))) for kv in got
                            if not int(kv.get("lease", 0))]
                    if not body.get("more") or not got:
                        break
                    start = base64.b64decode(got[-1]["key"]) + b"\0"
                found[prefix] = kvs
    return revision, found


async def replace_prefix(etcd: EtcdEndpoint, prefix: str, kvs: Sequence[KeyValue]) -> int:
    """Delete every key under ``prefix``, then write ``kvs`` (keys relative to it) in batches;
    how many keys were deleted. Not atomic: a failure part way leaves the prefix partly
    written, and calling this again finishes it."""
    start, end = _range(prefix)
    with _failing(etcd, "write"):
        async with aiohttp.ClientSession() as session:
            deleted = await _post(session, etcd, "/v3/kv/deleterange",
                                  {"key": _b64(start), "range_end": _b64(end)})
            batch: list[dict[str, Any]] = []
            size = 0
            for key, value in kvs:
                put = {"request_put": {"key": _b64(prefix.encode() + key), "value": _b64(value)}}
                if batch and (len(batch) >= TXN_OPS or size + len(key) + len(value) > TXN_BYTES):
                    await _post(session, etcd, "/v3/kv/txn", {"success": batch})
                    batch, size = [], 0
                batch.append(put)
                size += len(key) + len(value)
            if batch:
                await _post(session, etcd, "/v3/kv/txn", {"success": batch})
    return int(deleted.get("deleted", 0))


async def _call(etcd: EtcdEndpoint, path: str, payload: dict[str, Any], *,
                compacted_ok: bool = False) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        return await _post(session, etcd, path, payload, compacted_ok=compacted_ok)


async def _post(session: aiohttp.ClientSession, etcd: EtcdEndpoint, path: str,
                payload: dict[str, Any], *, compacted_ok: bool = False) -> dict[str, Any]:
    async with session.post(etcd.url + path, json=payload, ssl=etcd.tls()) as response:
        if response.status == 400:
            text = await response.text()
            if "compacted" in text:
                if compacted_ok:  # already compacted to this revision: nothing to do
                    return {}
                raise CompactedError(
                    f"etcd compacted revision {payload.get('revision')} while it was read "
                    f"({text.strip()}): try again; a read must end within the API servers' "
                    f"compaction interval (5 minutes)")
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
        return body


@contextlib.contextmanager
def _failing(etcd: EtcdEndpoint, doing: str) -> Iterator[None]:
    """etcd not answering, or refusing, as one StateError that names it."""
    try:
        yield
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        raise StateError(f"etcd at {etcd.url} failed to {doing} ({error}): is 'fakefleet up' "
                         f"running? 'fakefleet status' shows etcd's health") from error


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _range(prefix: str) -> tuple[bytes, bytes]:
    if not prefix.endswith("/"):
        raise ValueError(f"etcd prefix {prefix!r} must end with '/' to stay in its subtree")
    return prefix.encode(), (prefix[:-1] + chr(ord(prefix[-1]) + 1)).encode()


async def _range_call(etcd: EtcdEndpoint, path: str, prefix: str,
                      **extra: Any) -> dict[str, Any]:
    start, end = _range(prefix)
    return await _call(etcd, path, {"key": _b64(start), "range_end": _b64(end), **extra})
