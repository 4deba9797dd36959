"""How fakefleet finds the shared etcd of a state directory: its URL and its credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from operators.controlplane.components import EtcdPorts
from operators.controlplane.errors import StateError
from operators.controlplane.etcd import EtcdFiles, read_ports, shared_etcd, write_ports
from operators.controlplane.pki import ensure_etcd_pki


def test_shared_etcd_is_reached_over_tls_with_fakefleets_certificate(tmp_path: Path) -> None:
    files = EtcdFiles.of(tmp_path)
    pki = ensure_etcd_pki(files.pki.directory)
    write_ports(files, EtcdPorts(client=2379, peer=2380))
    etcd = shared_etcd(tmp_path)
    assert etcd.url == "https://127.0.0.1:2379"
    assert etcd.health_url == "https://127.0.0.1:2379/health"
    assert etcd.pki == pki
    assert etcd.tls().verify_mode.name == "CERT_REQUIRED"


def test_no_shared_etcd_says_how_to_start_one(tmp_path: Path) -> None:
    with pytest.raises(StateError, match=r"no shared etcd in .*: start it with 'fakefleet up'"):
        shared_etcd(tmp_path)


def test_shared_etcd_without_credentials_names_them(tmp_path: Path) -> None:
    files = EtcdFiles.of(tmp_path)
    files.directory.mkdir()
    write_ports(files, EtcdPorts(client=2379, peer=2380))
    with pytest.raises(StateError, match=r"fakefleet-client\.key") as error:
        shared_etcd(tmp_path)
    assert "'fakefleet down' and 'fakefleet up'" in str(error.value)


def test_ports_are_written_whole_and_a_truncated_file_reads_as_none(tmp_path: Path) -> None:
    """Defect: a crash in the middle of writing ports.json left a file that made every later
    start fail; it is now written aside and renamed, and an unreadable one is chosen anew."""
    files = EtcdFiles.of(tmp_path)
    files.directory.mkdir(parents=True)
    write_ports(files, EtcdPorts(client=2379, peer=2380))
    assert read_ports(files) == EtcdPorts(client=2379, peer=2380)
    assert oct(files.ports_file.stat().st_mode & 0o777) == "0o600"
    files.ports_file.write_text('{"client": 23')
    assert read_ports(files) is None
