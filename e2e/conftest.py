"""Fixtures for end-to-end tests: real etcd, kube-apiserver, scheduler and controller-manager.

The binaries come from the per-user cache (built once by ``make setup``; built here if missing),
so these tests never skip: they either run on real components or fail saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.ordering import longest_first
from operators.controlplane import binaries as binaries_
from operators.controlplane.state import StateDir, read_operator
from operators.controlplane.substrate import Substrate

BIN = Path(sys.executable).parent
KUBECTL = BIN / "kubectl"
FAKEFLEET = BIN / "fakefleet"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first, so that neither xdist worker starts a long one last (see
    e2e/ordering.py); it sees every collected item, the unit tests' too."""
    items[:] = longest_first(items)


@pytest.fixture(scope="session")
def binaries() -> binaries_.Binaries:
    return binaries_.resolve(binaries_.DEFAULT_KUBERNETES_VERSION)


@pytest.fixture(scope="session")
def state_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="session")
async def substrate(binaries: binaries_.Binaries, state_root: Path) -> AsyncIterator[Substrate]:
    async with Substrate(state_root / "shared", binaries, fsync=False) as running:
        yield running


def kubectl(kubeconfig: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True, text=True, check=check, timeout=60,
    )


def kubectl_json(kubeconfig: Path, *args: str) -> Any:
    return json.loads(kubectl(kubeconfig, *args, "-o", "json").stdout)


def eventually(predicate: Callable[[], Any], *, timeout: float = 60.0, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what or predicate}")
        time.sleep(0.25)


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line mentions ``text`` (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().split(") ")[-1][:1]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def fakefleet(*args: str, env: dict[str, str] | None = None,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FAKEFLEET), *args], capture_output=True, text=True, check=check, timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def cli_state(tmp_path: Path) -> Iterator[Path]:
    """A state directory for CLI tests; whatever a test leaves running is stopped after it."""
    state = tmp_path / "cli-state"
    yield state
    fakefleet("down", "--state-dir", str(state), check=False)


CLUSTER = """
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {name}}}
spec: {{labels: {{region: test}}}}
"""
#: The node-lifecycle controller's grace (spec.controlPlane.nodeMonitorGracePeriod) of the
#: clusters whose tests wait for it to mark nodes NotReady: 20 s instead of its 50 s.
SHORT_GRACE = "20s"


def with_short_grace(manifest: str) -> str:
    """A FakeCluster manifest made of CLUSTER, with the node-lifecycle controller's grace
    SHORT_GRACE."""
    plain = "spec: {labels: {region: test}}"
    assert plain in manifest, manifest
    return manifest.replace(plain, "spec: {labels: {region: test}, controlPlane: "
                                   f"{{nodeMonitorGracePeriod: {SHORT_GRACE}}}}}")


POOL = """
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: {name}}}
spec:
  clusterRef: {cluster}
  replicas: {replicas}
{extra}
"""


class Fleet:
    def __init__(self, state: Path) -> None:
        self.state = state
        self.host = StateDir(state).host_kubeconfig

    def apply(self, manifest: str) -> None:
        subprocess.run([str(KUBECTL), "--kubeconfig", str(self.host), "apply", "-f", "-"],
                       input=manifest, text=True, check=True, capture_output=True, timeout=60)

    def get(self, *args: str) -> Any:
        return kubectl_json(self.host, "get", *args)

    def member(self, cluster: str) -> Path:
        path = self.state / f"{cluster}.kubeconfig"
        path.write_text(fakefleet("kubeconfig", "--state-dir", str(self.state), cluster).stdout)
        return path

    def wait_cluster_ready(self, name: str, timeout: float = 120,
                           since: str = "") -> dict[str, Any]:
        """Wait for phase Ready; with ``since`` (RFC 3339), for a Ready that began no earlier,
        so a status written before an operator restart does not count."""
        def ready() -> dict[str, Any] | None:
            found: dict[str, Any] = self.get("fc", name)
            status = found.get("status", {})
            began = next((c.get("lastTransitionTime") or "" for c in status.get("conditions", [])
                          if c["type"] == "Ready" and c["status"] == "True"), "")
            return found if status.get("phase") == "Ready" and began >= since else None
        result: dict[str, Any] = eventually(ready, timeout=timeout, what=f"FakeCluster {name}")
        return result

    def wait_pool(self, name: str, ready: int, timeout: float = 120) -> dict[str, Any]:
        def settled() -> dict[str, Any] | None:
            found: dict[str, Any] = self.get("fnp", name)
            status = found.get("status", {})
            return found if (status.get("readyReplicas") == ready
                             and status.get("replicas") == ready) else None
        result: dict[str, Any] = eventually(settled, timeout=timeout,
                                            what=f"pool {name} at {ready} Ready nodes")
        return result

    def release(self, cluster: str, *pools: str) -> None:
        """Delete a module's member and its pools (namespace default), without waiting: an idle
        member costs about 0.03 cores and 500 MiB (docs/scale-out.md), which every later
        module of the worker would otherwise share two cores with."""
        for pool in pools:
            kubectl(self.host, "delete", "fnp", pool, "--wait=false", check=False)
        kubectl(self.host, "delete", "fc", cluster, "--wait=false", check=False)

    def operator_pid(self) -> int:
        """The pid of the operator that announced itself ready (0: none yet)."""
        announced = read_operator(StateDir(self.state))
        return announced.pid if announced is not None and announced.ready else 0

    def operator_restarted(self, old: int) -> bool:
        return self.operator_pid() not in (0, old)

    def command_line(self, cluster: str, component: str, namespace: str = "default") -> str:
        """The command line of a member's process (``kube-controller-manager``, ``engine``)."""
        pid = self.member_processes(cluster, namespace)[component]
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()

    def member_processes(self, cluster: str, namespace: str = "default") -> dict[str, int]:
        """The pids of a member's processes (kube-apiserver, engine, ...), as the operator that
        announced itself ready lists them."""
        announced = read_operator(StateDir(self.state))
        if announced is None or not announced.ready:
            return {}
        return {component.name: component.pid for component in announced.components
                if component.cluster == f"{namespace}.{cluster}" and component.pid}

    def wait_member_served(self, cluster: str, old_operator: int,
                           components: frozenset[str] = frozenset({"kube-apiserver", "engine"}),
                           timeout: float = 90, namespace: str = "default") -> dict[str, int]:
        """After the operator ``old_operator`` was killed: wait until the one that followed it
        supervises the member's ``components`` again; the pids of what it supervises."""
        def served() -> dict[str, int] | None:
            found = self.member_processes(cluster, namespace)
            return found if self.operator_restarted(old_operator) and \
                components <= set(found) else None
        result: dict[str, int] = eventually(served, timeout=timeout,
                                            what=f"the next operator to serve {cluster}")
        return result


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    state = tmp_path_factory.mktemp("fleet")
    fakefleet("up", "--state-dir", str(state), "--unsafe-no-fsync")
    try:
        yield Fleet(state)
    finally:
        fakefleet("down", "--state-dir", str(state), check=False)
