"""The shared etcd as fakefleet reaches it: where its files are in the state directory, how a
client connects to it, and the two calls fakefleet makes to it (count and delete a key prefix).

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
    async with aiohttp.ClientSession() as session, session.post(
        etcd.url + path, json=payload, ssl=etcd.tls()
    ) as response:
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
        return body
