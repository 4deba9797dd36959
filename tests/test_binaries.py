"""Resolution order: explicit override, then the cache, then a build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from operators.controlplane import binaries
from operators.controlplane.errors import BinaryError


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in binaries.OVERRIDES.values():
        monkeypatch.delenv(variable, raising=False)


def test_cache_key_changes_with_version(tmp_path: Path) -> None:
    assert binaries.cache_entry("v1.36.3", tmp_path) != binaries.cache_entry("v1.35.2", tmp_path)
    assert binaries.cache_entry("v1.36.3", tmp_path) == binaries.cache_entry("v1.36.3", tmp_path)


def test_cache_root_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FAKEFLEET_CACHE_DIR", str(tmp_path / "explicit"))
    assert binaries.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("FAKEFLEET_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert binaries.cache_root() == tmp_path / "xdg" / "fakefleet"


def test_complete_cache_entry_is_used_without_building(tmp_path: Path) -> None:
    entry = binaries.cache_entry("v1.36.3", tmp_path)
    for name in binaries.OVERRIDES:
        _executable(entry / name)
    (entry / "manifest.json").write_text(json.dumps({}))
    found = binaries.resolve("v1.36.3", root=tmp_path, allow_build=False)
    assert found.kube_apiserver == entry / "kube-apiserver"
    assert found.path("etcd") == entry / "etcd"


def test_partial_cache_entry_is_not_trusted(tmp_path: Path) -> None:
    entry = binaries.cache_entry("v1.36.3", tmp_path)
    for name in binaries.OVERRIDES:
        _executable(entry / name)
    with pytest.raises(BinaryError, match=r"no build of Kubernetes v1\.36\.3 in the cache"):
        binaries.resolve("v1.36.3", root=tmp_path, allow_build=False)


def test_overrides_win_over_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, variable in binaries.OVERRIDES.items():
        monkeypatch.setenv(variable, str(_executable(tmp_path / "mine" / name)))
    found = binaries.resolve("v1.36.3", root=tmp_path / "empty", allow_build=False)
    assert found.kube_scheduler == tmp_path / "mine" / "kube-scheduler"


def test_missing_override_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FAKEFLEET_KUBE_APISERVER", str(tmp_path / "nope"))
    with pytest.raises(BinaryError, match=r"FAKEFLEET_KUBE_APISERVER=.*nope does not name an"):
        binaries.resolve("v1.36.3", root=tmp_path, allow_build=False)
