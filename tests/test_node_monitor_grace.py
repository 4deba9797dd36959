"""A FakeCluster's spec.controlPlane.nodeMonitorGracePeriod reaches both who must know it: the
member's kube-controller-manager (--node-monitor-grace-period) and the engine
(--node-monitor-grace), which paces Lease renewals by it. Unset, neither is told anything."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest

from operators.api.clusters import FakeCluster
from operators.controlplane.binaries import Binaries
from operators.handlers import clusters as handler
from operators.handlers import runtime as runtime_
from operators.handlers.runtime import Runtime
from operators.k8s.config import HostConfig
from operators.reconciling.clusters import StartControlPlane, StartEngine


def cluster(**control_plane: Any) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": "west", "namespace": "default", "uid": "u", "generation": 1},
        "spec": {"controlPlane": control_plane}})


class Recorder:
    """What the handler asks of the substrate and of the runtime's engines."""

    def __init__(self) -> None:
        self.options: list[Any] = []
        self.engines: list[dict[str, Any]] = []

    async def add_cluster(self, key: str, options: Any) -> None:
        self.options.append(options)

    async def start_engine(self, key: str, namespace: str, name: str, kubeconfig: Path,
                           **given: Any) -> None:
        self.engines.append(given)


def recording_runtime(recorder: Recorder) -> Runtime:
    path = Path("/cache/v1.36.3")
    releases = types.SimpleNamespace(binaries=lambda version: Binaries(version, *[path] * 4))
    return cast(Runtime, types.SimpleNamespace(
        releases=releases, substrate=recorder, default_profile=runtime_.Profile.DEFAULT,
        start_engine=recorder.start_engine,
        external={"default.west": types.SimpleNamespace(kubeconfig=Path("/member"))}))


@pytest.mark.parametrize(("control_plane", "grace"), [
    ({}, None), ({"nodeMonitorGracePeriod": "20s"}, 20.0),
    ({"nodeMonitorGracePeriod": "1m30s"}, 90.0),
])
async def test_the_grace_goes_to_the_controller_manager_and_the_engine(
        control_plane: dict[str, Any], grace: float | None) -> None:
    recorder = Recorder()
    runtime = recording_runtime(recorder)
    for action in (StartControlPlane(), StartEngine()):
        await handler.execute(runtime, cluster(**control_plane), "default.west", action)
    (options,) = recorder.options
    assert options.node_monitor_grace == grace
    assert recorder.engines == [{"kubelet_pki": None, "node_grace": grace}]


class FakeProcess:
    started: ClassVar[list[list[str]]] = []

    def __init__(self, name: str, argv: list[str], **_: Any) -> None:
        self.argv = argv

    async def start(self) -> None:
        FakeProcess.started.append(self.argv)


@pytest.mark.parametrize(("grace", "flags"), [
    (None, []), (20.0, ["--node-monitor-grace", "20"]),
    (90.5, ["--node-monitor-grace", "90.5"]),
])
async def test_the_engine_is_told_the_grace_on_its_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, grace: float | None,
        flags: list[str]) -> None:
    async def not_running(*_: Any) -> bool:
        return False

    monkeypatch.setattr(runtime_, "Supervised", FakeProcess)
    monkeypatch.setattr(runtime_.health, "adopt", not_running)
    FakeProcess.started = []
    runtime = cast(Runtime, types.SimpleNamespace(
        engines={}, state_dir=tmp_path, host_config=HostConfig(kubeconfig=Path("/host")),
        subreaper=None))
    await Runtime.start_engine(runtime, "default.west", "default", "west", Path("/member"),
                               node_grace=grace)
    (argv,) = FakeProcess.started
    if flags:
        at = argv.index(flags[0])
        assert argv[at:at + 2] == flags
    else:
        assert "--node-monitor-grace" not in argv, "the same command line as before the field"
