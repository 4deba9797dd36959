"""The shared etcd as fakefleet reaches it: where its files are in the state directory, how a
client connects to it, and the calls fakefleet makes to it (count and delete a key prefix; read,
and clear, its alarms).

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
import dataclasses
import json
import logging
import ssl
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


async def _call(etcd: EtcdEndpoint, path: str, payload: dict[str, Any], *,
                compacted_ok: bool = False) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        etcd.url + path, json=payload, ssl=etcd.tls()
    ) as response:
        if compacted_ok and response.status == 400:
            text = await response.text()
            if "compacted" in text:  # already compacted to this revision: nothing to do
                return {}
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
        return body


async def _range_call(etcd: EtcdEndpoint, path: str, prefix: str,
                      **extra: Any) -> dict[str, Any]:
    if not prefix.endswith("/"):
        raise ValueError(f"etcd prefix {prefix!r} must end with '/' to stay in its subtree")
    range_end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    payload = {
        "key": base64.b64encode(prefix.encode()).decode(),
        "range_end": base64.b64encode(range_end.encode()).decode(),
        **extra,
    }
    return await _call(etcd, path, payload)
