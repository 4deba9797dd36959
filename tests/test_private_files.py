"""Keys, kubeconfigs and the state directory are private from their creation, whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from operators.controlplane.components import ClusterPorts
from operators.controlplane.pki import KubeletPKI, ensure_pki
from operators.controlplane.state import StateDir
from operators.controlplane.substrate import ClusterOptions, LocalCluster, write_kubeconfigs
from primitives.files import private_directory, write_private


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """Nothing here may rely on the umask to hide a file."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_directory_is_created_private(tmp_path: Path) -> None:
    state = private_directory(tmp_path / "deep" / "state")
    assert _mode(state) == 0o700


def test_existing_state_directory_is_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    private_directory(state)
    assert _mode(state) == 0o700


def test_private_file_is_created_0600_and_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    path.write_text("old")
    path.chmod(0o644)
    write_private(path, b"new")
    assert path.read_bytes() == b"new"
    assert _mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["secret.key"]


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    path.write_bytes(b"old")
    not_bytes: Any = "text"
    with pytest.raises(TypeError):
        write_private(path, not_bytes)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["secret.key"]


def test_every_key_of_a_pki_is_0600_in_a_0700_directory(tmp_path: Path) -> None:
    pki = ensure_pki(tmp_path / "pki", "a")
    assert _mode(pki.directory) == 0o700
    keys = [p for p in pki.directory.iterdir() if p.suffix == ".key"]
    assert len(keys) == 7  # CA, serving, four clients (the engine's too), service accounts
    for key in keys:
        assert _mode(key) == 0o600, key.name


def test_kubeconfigs_are_0600(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    directory = state.cluster("a")
    directory.mkdir(parents=True)
    cluster = LocalCluster(
        "a", state, ClusterPorts(apiserver=1, scheduler=2, controller_manager=3),
        ClusterOptions(), ensure_pki(directory / "pki", "a"), processes={},
        kubelet_pki=KubeletPKI(directory / "kubelet"),
    )
    write_kubeconfigs(cluster)
    written = sorted(p.name for p in directory.iterdir() if p.name.endswith("kubeconfig"))
    assert written == ["engine.kubeconfig", "kube-controller-manager.kubeconfig",
                       "kube-scheduler.kubeconfig", "kubeconfig"]
    for name in written:
        assert _mode(directory / name) == 0o600, name
