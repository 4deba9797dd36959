"""Add-ons as a protocol: the life every add-on lives (pure), and one add-on of the protocol
through the runner with a real (tiny) process; the cluster's status with several add-ons."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Never, assert_never

import pytest

from operators.addons import lifecycle
from operators.addons.lifecycle import Build, Hook, Observed, Start, Step, Stop
from operators.addons.registry import runners
from operators.addons.running import Files, Instance, Launch, Runner, Site
from operators.api.clusters import FakeCluster
from operators.controlplane.errors import AddonError
from operators.controlplane.state import StateDir
from operators.controlplane.tools import GoTool
from operators.reconciling import clusters as cluster_planning
from operators.reconciling.clusters import AddonCondition, AddonState
from primitives.files import private_directory

NOW = "2026-12-01T09:00:00Z"
CLUSTER = FakeCluster.model_validate({
    "metadata": {"name": "west", "namespace": "default", "generation": 1, "uid": "u"},
    "spec": {}})


# -- the lifecycle, pure ------------------------------------------------------------------------

def steps(observed: Observed, **overrides: bool) -> Sequence[Step] | None:
    return lifecycle.plan(observed, **{"wanted": True, "serving": False, **overrides})


def test_the_lifecycle_builds_waits_starts_hooks_then_leaves_the_rest_to_the_addon() -> None:
    assert steps(Observed()) == [Build()]
    assert steps(Observed(building_for=3.0)) == [], "one build at a time"
    assert steps(Observed(build_error="no such host")) == [], "until the retry forgets it"
    assert steps(Observed(binary=True)) == [], "no start before the API server answers"
    up = Observed(binary=True, control_plane_running=True)
    assert steps(up) == [Start()]
    started = Observed(**{**up.__dict__, "supervised": True})
    assert steps(started) == [], "no hooks before it serves"
    assert steps(started, serving=True) == [Hook()]
    hooked = Observed(**{**started.__dict__, "hooked": True})
    assert steps(hooked, serving=True) is None
    assert steps(hooked, serving=True, restart=True) == [Stop(unhook=False), Start()]


def test_an_addon_no_longer_wanted_is_stopped_while_anything_of_it_is_left() -> None:
    assert steps(Observed(supervised=True), wanted=False) == [Stop()]
    assert steps(Observed(installed=True), wanted=False) == [Stop()]
    assert steps(Observed(), wanted=False) == []


def test_the_condition_says_where_on_the_way_it_is() -> None:
    def said(observed: Observed, serving: bool = False) -> AddonState | None:
        return lifecycle.condition(observed, serving=serving, title="Thing v1", crashed="Thing",
                                   cold_build="a while")

    assert said(Observed(build_error="boom")) == AddonState(
        False, "BuildFailed", "Thing v1 could not be built: boom")
    assert said(Observed(building_for=12.0)) == AddonState(
        False, "Building", "building Thing v1 from the Go module proxy into the cache (12s so "
                           "far); a cold build takes a while ('fakefleet binaries' builds it "
                           "ahead of time)")
    assert said(Observed(binary=True)) == AddonState(
        False, "Waiting", "waiting for the cluster's API server")
    up = Observed(binary=True, control_plane_running=True, supervised=True)
    assert said(up) == AddonState(False, "Starting", "starting Thing v1")
    assert said(Observed(**{**up.__dict__, "restarts": 2, "log_tail": "panic: no\n"})) == \
        AddonState(False, "Crashed", "Thing exited and was restarted 2 times: panic: no")
    assert said(Observed(**{**up.__dict__, "hooked": True}), serving=True) is None


# -- one add-on of the protocol through the runner ----------------------------------------------

class Thing:
    """An add-on of the protocol whose process is ``sleep``; it serves once it is supervised."""

    name = "thing"
    tool = GoTool(name="thing", title="Thing", package="example.com/thing/cmd/thing",
                  version="v1", override="FAKEFLEET_THING")
    condition = AddonCondition("ThingReady", "Thing")
    hooks = "webhooks"

    def __init__(self) -> None:
        self.on = True
        self.broken = False
        self.observed = 0
        self.calls: list[str] = []

    def wanted(self, cluster: FakeCluster) -> bool:
        return self.on

    def files(self, state: StateDir, key: str) -> Files:
        return Files.of(state, key, self.name)

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> Observed:
        self.observed += 1
        return lifecycle

    def plan(self, cluster: FakeCluster, observed: Observed) -> Sequence[Step]:
        planned = lifecycle.plan(observed, wanted=self.on, serving=observed.supervised)
        return [] if planned is None else planned

    def state(self, cluster: FakeCluster, observed: Observed) -> AddonState | None:
        if not self.on:
            return None
        return lifecycle.condition(observed, serving=observed.supervised, title="Thing v1",
                                   crashed="Thing", cold_build="a while") \
            or AddonState(True, "Running", "Thing v1 running")

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        if self.broken:
            raise AddonError("its CRDs were refused")
        private_directory(self.files(site.state, site.key).directory)
        self.calls.append("setup")
        return Launch([str(binary), "60"], settings="s1")

    async def hook(self, site: Site) -> None:
        self.calls.append("hook")

    async def unhook(self, site: Site) -> None:
        self.calls.append("unhook")

    async def act(self, site: Site, cluster: FakeCluster, action: Never,
                  instance: Instance) -> None:
        assert_never(action)

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        return 1234, "http://127.0.0.1:1234/healthz"


@pytest.fixture
def thing(monkeypatch: pytest.MonkeyPatch) -> Thing:
    sleep = shutil.which("sleep")
    assert sleep is not None
    monkeypatch.setenv(Thing.tool.override, sleep)
    return Thing()


def site(tmp_path: Path, *, apiserver_running: bool = True) -> Site:
    local = SimpleNamespace(apiserver=SimpleNamespace(running=apiserver_running))
    return Site(key="default.west", state=StateDir(tmp_path), host=None,  # type: ignore[arg-type]
                local=local)  # type: ignore[arg-type]


async def test_an_addon_not_asked_for_is_not_even_observed(tmp_path: Path, thing: Thing) -> None:
    thing.on = False
    runner = Runner(thing)
    assert await runner.reconcile(site(tmp_path), CLUSTER, control_plane_running=True) is None
    assert thing.observed == 0


async def test_an_addon_is_started_hooked_listed_and_stopped_with_its_hooks(
        tmp_path: Path, thing: Thing, caplog: pytest.LogCaptureFixture) -> None:
    runner = Runner(thing)
    here = site(tmp_path)
    waiting = await runner.reconcile(here, CLUSTER, control_plane_running=False)
    assert waiting == AddonState(False, "Waiting", "waiting for the cluster's API server")
    try:
        started = await runner.reconcile(here, CLUSTER, control_plane_running=True)
        assert started == AddonState(False, "Starting", "starting Thing v1")
        instance = runner.instances["default.west"]
        assert instance.process.running
        assert instance.process.name == "default.west/thing"
        assert instance.settings == "s1"
        running = await runner.reconcile(here, CLUSTER, control_plane_running=True)
        assert running == AddonState(True, "Running", "Thing v1 running")
        assert instance.hooked
        assert thing.calls == ["setup", "hook"]
        (component,) = runner.components(here.state)
        assert (component.cluster, component.name, component.port) == ("default.west", "thing",
                                                                         1234)
        assert component.log == str(tmp_path / "clusters" / "default.west" / "thing" /
                                    "thing.log")
        thing.on = False
        down = site(tmp_path, apiserver_running=False)
        # No longer asked for, it has no condition to say so: the log does.
        assert await runner.reconcile(down, CLUSTER, control_plane_running=False) is None
        assert "cluster default.west: thing: StopThing failed: Thing stopped, but its webhooks " \
               "cannot be removed while the cluster's API server is down; trying again" in \
               caplog.messages
        assert not runner.instances
        assert (tmp_path / "clusters" / "default.west" / "thing").is_dir(), "left to undo"
        assert await runner.reconcile(here, CLUSTER, control_plane_running=True) is None
        assert thing.calls[-1] == "unhook"
        assert not (tmp_path / "clusters" / "default.west" / "thing").exists()
    finally:
        await runner.stop_all()


async def test_a_failed_setup_names_the_step_and_the_addon(tmp_path: Path, thing: Thing) -> None:
    thing.broken = True
    runner = Runner(thing)
    failed = await runner.reconcile(site(tmp_path), CLUSTER, control_plane_running=True)
    assert failed == AddonState(False, "SetupFailed", "StartThing failed: its CRDs were refused")
    assert not runner.instances


def test_the_registry_makes_a_fresh_runner_for_each_addon_in_status_order() -> None:
    first, second = runners(), runners()
    assert [r.addon.condition.type for r in first] == ["KueueReady", "MetricsServerReady",
                                                      "KarpenterReady", "KubeRayReady"]
    assert [r.addon.name for r in first] == ["kueue", "metrics-server", "karpenter", "kuberay"]
    assert first[0].instances is not second[0].instances


# -- the cluster's status with its add-ons -------------------------------------------------------

def test_ready_waits_for_each_required_addon_and_every_addon_has_its_condition() -> None:
    gate = AddonCondition("GateReady", "Gate", required=True)
    extra = AddonCondition("ExtraReady", "Extra")
    up = cluster_planning.Observed(control_plane_running=True, secret_current=True,
                                   engine_running=True, endpoint="https://127.0.0.1:1")
    waiting = cluster_planning.Observed(**{**up.__dict__, "addons": (
        (gate, AddonState(False, "Starting", "starting Gate")),
        (extra, AddonState(False, "Starting", "starting Extra")))})
    status = cluster_planning.status(CLUSTER, waiting, now=NOW, previous=None)
    conditions = {c.type: c for c in status.conditions}
    assert (conditions["Ready"].reason, conditions["Ready"].message) == (
        "GateNotReady", "Gate: starting Gate")
    assert [c.type for c in status.conditions][-2:] == ["GateReady", "ExtraReady"]
    ready = cluster_planning.Observed(**{**up.__dict__, "addons": (
        (gate, AddonState(True, "Running", "ok")),
        (extra, AddonState(False, "Starting", "starting Extra")))})
    status = cluster_planning.status(CLUSTER, ready, now=NOW, previous=None)
    assert status.phase == "Ready", "Extra is not required"
    assert {c.type: c for c in status.conditions}["Ready"].message == \
        "API server at https://127.0.0.1:1, engine running, Gate running"
