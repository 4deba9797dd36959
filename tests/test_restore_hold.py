"""The operator's side of a snapshot restore: a hold stops what it does not name, starts the API
server when it names it, and is answered only once that is done."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

from operators.api.clusters import FakeCluster
from operators.api.restores import RestoreHold
from operators.handlers.clusters import hold_for_restore
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.config import HostConfig
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

CLUSTERS = "/apis/fakefleet.dev/v1alpha1/namespaces/default/fakeclusters"
KEY = "default.west"


class Process:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name, self.supervised = log, name, True

    @property
    def running(self) -> bool:
        return self.supervised

    async def stop(self, timeout: float = 15.0) -> None:
        self.log.append(f"stop {self.name}")
        self.supervised = False

    async def start(self) -> None:
        self.log.append(f"start {self.name}")
        self.supervised = True


class Local:
    def __init__(self, log: list[str]) -> None:
        self.processes = {name: Process(log, name) for name in
                          ("kube-apiserver", "kube-scheduler", "kube-controller-manager")}
        self.endpoint = "https://127.0.0.1:1"

    @property
    def apiserver(self) -> Process:
        return self.processes["kube-apiserver"]


class Substrate:
    def __init__(self, local: Local) -> None:
        self.clusters = {KEY: local}


def runtime(tmp_path: Path, host: Client, log: list[str]) -> Runtime:
    made = Runtime(state_dir=tmp_path, host=host,
                   host_config=HostConfig(kubeconfig=tmp_path / "kubeconfig"),
                   substrate=cast(Any, Substrate(Local(log))),
                   resolve_binaries=lambda *_, **__: cast(Any, object()), addons=())
    made.engines[KEY] = cast(Any, Process(log, "engine"))
    made.versions[KEY] = ("v1.36.3", time.monotonic())
    return made


async def held(tmp_path: Path, hold: RestoreHold) -> tuple[list[str], dict[str, Any]]:
    api = MemoryTransport(FakeClock())
    api.put(CLUSTERS, {"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                       "metadata": {"name": "west", "namespace": "default",
                                    "annotations": {keys.RESTORE: hold.render()}},
                       "spec": {}})
    log: list[str] = []
    async with Client(api) as host:
        cluster = FakeCluster.model_validate(api.object(f"{CLUSTERS}/west"))
        await hold_for_restore(runtime(tmp_path, host, log), cluster, KEY, hold)
    found = api.object(f"{CLUSTERS}/west")
    assert found is not None
    return log, found


async def test_a_hold_of_nothing_stops_everything_then_answers(tmp_path: Path) -> None:
    log, found = await held(tmp_path, RestoreHold("1"))
    assert log == ["stop engine", "stop kube-controller-manager", "stop kube-scheduler",
                   "stop kube-apiserver"]
    assert found["metadata"]["annotations"][keys.RESTORE_HELD] == "1:"
    assert found["status"]["phase"] != "Ready"
    assert "held by the restore of a snapshot (1)" in str(found["status"]["conditions"])


async def test_a_hold_that_names_the_api_server_keeps_it(tmp_path: Path) -> None:
    log, found = await held(tmp_path, RestoreHold("2", ("kube-apiserver",)))
    assert log == ["stop engine", "stop kube-controller-manager", "stop kube-scheduler"]
    assert found["metadata"]["annotations"][keys.RESTORE_HELD] == "2:kube-apiserver"
    assert found["status"]["phase"] != "Ready"
