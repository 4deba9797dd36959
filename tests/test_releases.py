"""A FakeCluster's kubernetesVersion builds that release on first use, in the background and one
build at a time; meanwhile the cluster is Provisioning and says what is being built, how long
it has run and how long builds here usually take."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import types
from pathlib import Path
from typing import Any, cast

import pytest

from operators.api.clusters import FakeCluster
from operators.controlplane import binaries as binaries_
from operators.controlplane.binaries import Binaries
from operators.controlplane.errors import BinaryError
from operators.handlers import clusters as handler
from operators.handlers.runtime import Releases, Runtime, usual_build
from operators.reconciling import clusters as planning
from operators.reconciling.clusters import BuildRelease, Observed, Release, StartControlPlane

NOW = "2026-12-02T00:00:00Z"


def cluster(version: str) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": f"c{version.replace('.', '-')}", "namespace": "default",
                     "uid": "u", "generation": 1},
        "spec": {"kubernetesVersion": version}})


class Builder:
    """A resolve() whose builds take a while and count how many run at once."""

    def __init__(self) -> None:
        self.built: set[str] = set()
        self.running = 0
        self.most = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, version: str, *, allow_build: bool = True,
                 progress: Any = None) -> Binaries:
        if version not in self.built:
            if not allow_build:
                raise BinaryError(f"no build of Kubernetes {version} in the cache")
            with self._lock:
                self.running += 1
                self.most = max(self.most, self.running)
            self.release.wait(10)
            with self._lock:
                self.running -= 1
                self.built.add(version)
        path = Path(f"/cache/{version}")
        return Binaries(version, path, path, path, path)


async def until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKEFLEET_CACHE_DIR", str(tmp_path))
    return tmp_path


async def test_builds_run_one_at_a_time_and_each_cluster_says_where_its_build_is() -> None:
    builder = Builder()
    runtime = cast(Runtime, types.SimpleNamespace(releases=Releases(builder)))
    first, second = cluster("v1.35.0"), cluster("v1.34.2")
    for each in (first, second):
        await handler.execute(runtime, each, "default.x", BuildRelease())
    await until(lambda: builder.running == 1)
    building = runtime.releases.observe("v1.35.0")
    waiting = runtime.releases.observe("v1.34.2")
    assert building is not None
    assert building.building_for is not None
    assert waiting == Release("v1.34.2", waiting_for="v1.35.0")
    builder.release.set()
    await until(lambda: runtime.releases.observe("v1.34.2") is None)
    assert runtime.releases.observe("v1.35.0") is None
    assert builder.most == 1, "never two Kubernetes builds at once"


async def test_starting_a_control_plane_never_builds_on_the_way() -> None:
    builder = Builder()
    runtime = cast(Runtime, types.SimpleNamespace(releases=Releases(builder)))
    with pytest.raises(BinaryError, match="not in the cache yet: it is being built"):
        await handler.execute(runtime, cluster("v1.35.0"), "default.x", StartControlPlane())
    assert builder.most == 0


def test_a_missing_release_is_built_first_and_nothing_else_meanwhile() -> None:
    missing = Observed(release=Release("v1.35.0"))
    assert planning.plan(cluster("v1.35.0"), missing) == [BuildRelease()]
    for under_way in (Release("v1.35.0", building_for=3.0),
                      Release("v1.35.0", waiting_for="v1.34.2"),
                      Release("v1.35.0", error="go: no such host")):
        assert planning.plan(cluster("v1.35.0"), Observed(release=under_way)) == []


@pytest.mark.parametrize(("release", "says"), [
    (Release("v1.35.0", building_for=185.0, usual=798.0),
     "building Kubernetes v1.35.0 (etcd, kube-apiserver, kube-scheduler, "
     "kube-controller-manager) from the Go module proxy into the cache: 3 min so far; builds "
     "here took 13 min"),
    (Release("v1.35.0", waiting_for="v1.34.2"),
     "waiting to build Kubernetes v1.35.0 (etcd, kube-apiserver, kube-scheduler, "
     "kube-controller-manager) from the Go module proxy into the cache: Kubernetes v1.34.2 is "
     "being built first (one build at a time; a first build takes 10 to 20 minutes on two "
     "cores)"),
    (Release("v1.35.0", error="go: no such host"),
     "building Kubernetes v1.35.0 (etcd, kube-apiserver, kube-scheduler, "
     "kube-controller-manager) from the Go module proxy into the cache failed, trying again in "
     "a few minutes: go: no such host"),
])
def test_the_status_says_what_is_built_and_how_long_it_takes(release: Release,
                                                            says: str) -> None:
    status = planning.status(cluster("v1.35.0"), Observed(release=release), now=NOW,
                             previous=None)
    ready = next(c for c in status.conditions if c.type == "Ready")
    reconciling = next(c for c in status.conditions if c.type == "Reconciling")
    assert status.phase == "Provisioning"
    assert ready.message == says
    assert reconciling.status == "True"


def test_how_long_builds_usually_take_is_read_from_the_cache(empty_cache: Path) -> None:
    for name, seconds in (("v1.36.3-a", 700.0), ("v1.35.0-b", 800.0), ("v1.34.0-c", 900.0)):
        entry = empty_cache / "kubernetes" / name
        entry.mkdir(parents=True)
        (entry / "manifest.json").write_text(json.dumps({"buildSeconds": seconds}))
    assert usual_build() == 800.0
    assert binaries_.cache_root() == empty_cache
