"""What the handlers work with, passed to them through kopf's ``memo`` (never globals)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from opentelemetry import trace

from operators.addons.kueue import building as kueue_building
from operators.addons.kueue.source import Manifests
from operators.addons.metricsserver import building as metricsserver_building
from operators.addons.metricsserver import source as metricsserver_source
from operators.controlplane.binaries import Binaries
from operators.controlplane.components import Profile
from operators.controlplane.errors import ControlPlaneError
from operators.controlplane.files import private_directory
from operators.controlplane.ports import free_port
from operators.controlplane.state import (
    EngineEndpoint,
    StateDir,
    publish,
    read_engine_endpoint,
)
from operators.controlplane.substrate import Substrate
from operators.controlplane.supervising import Supervised
from operators.k8s.client import Client
from operators.k8s.config import ClusterAccess, HostConfig
from operators.reconciling.clusters import HubState

logger = logging.getLogger(__name__)

#: An engine that ran this long is healthy: its next crash restarts it after the shortest wait.
ENGINE_STABLE_AFTER = 60.0
#: Seconds after a failed build of an add-on's binary before a reconcile builds it again.
BUILD_RETRY = 120.0


@dataclasses.dataclass
class Member:
    """How the operator reaches a member cluster, and the kubeconfig its engine reads."""

    access: ClusterAccess
    kubeconfig: Path


@dataclasses.dataclass
class Runtime:
    """The operator's dependencies and its in-memory view of the member clusters."""

    state_dir: Path
    host: Client
    #: Where the host's credentials come from: kopf logs in with it, engines are given it.
    host_config: HostConfig
    substrate: Substrate
    resolve_binaries: Callable[[str], Binaries]
    external: dict[str, Member] = dataclasses.field(default_factory=dict)
    engines: dict[str, Supervised] = dataclasses.field(default_factory=dict)
    #: Each member's API server version, and when it last said so (time.monotonic()).
    versions: dict[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = dataclasses.field(default_factory=dict)
    #: FaultPlans whose daemon runs now (namespace/name): their finalizer waits for it.
    plans: set[str] = dataclasses.field(default_factory=set)
    #: Each member's hub link, as its daemon last saw it (the HubConnected condition).
    hub_links: dict[str, HubState] = dataclasses.field(default_factory=dict)
    #: The members' Kueue add-ons and the one background build of its binary.
    kueue: KueueAddons = dataclasses.field(default_factory=lambda: KueueAddons())
    #: The members' metrics-servers and the one background build of its binary.
    metrics_servers: MetricsServerAddons = dataclasses.field(
        default_factory=lambda: MetricsServerAddons())
    #: Makes the handlers' spans: the entry point passes its configured provider's; the
    #: default is the API's global one (no spans until an SDK is configured).
    tracer: trace.Tracer = dataclasses.field(
        default_factory=lambda: trace.get_tracer("operators.handlers"))
    #: The profile of FakeClusters whose spec.controlPlane.profile is not set.
    default_profile: Profile = Profile.DEFAULT

    def lock(self, key: str) -> asyncio.Lock:
        """One reconciliation at a time per object (change handlers and timers overlap)."""
        return self.locks.setdefault(key, asyncio.Lock())

    def engine_running(self, key: str) -> bool:
        engine = self.engines.get(key)
        return engine is not None and engine.running

    async def start_engine(self, key: str, namespace: str, name: str,
                           member_kubeconfig: Path) -> Supervised:
        """The cluster's engine process, supervised: its log in the cluster's directory,
        restarted with back-off (reset after a healthy minute) when it dies."""
        engine = self.engines.get(key)
        if engine is not None:
            return engine
        endpoint = self.engine_endpoint(key, choose=True)
        assert endpoint is not None
        engine = Supervised(
            f"{key}/engine",
            [sys.executable, "-m", "operators.engine", "--kubeconfig", str(member_kubeconfig),
             *engine_host_arguments(self.host_config), "--cluster", f"{namespace}/{name}",
             "--kubelet-port", str(endpoint.kubeletPort)],
            log_path=StateDir(self.state_dir).engine_log(key),
            stable_after=ENGINE_STABLE_AFTER, death_signal=signal.SIGTERM,
        )
        await engine.start()
        self.engines[key] = engine
        return engine

    def engine_endpoint(self, key: str, *, choose: bool = False) -> EngineEndpoint | None:
        """Where the member's engine serves its nodes' kubelets and DCGM metrics: the port it
        had, which its nodes advertise (an engine of the previous operator may still hold it
        for a moment: the new one waits for it), or with ``choose`` a free one if there is none
        yet."""
        state = StateDir(self.state_dir)
        found = read_engine_endpoint(state, key)
        if not choose or found is not None:
            return found
        # Not a port another member's engine has (it may not be listening right now).
        taken = {endpoint.kubeletPort for other in state.clusters.glob("*")
                 if (endpoint := read_engine_endpoint(state, other.name)) is not None}
        port = free_port()
        while port in taken:
            port = free_port()
        endpoint = EngineEndpoint(kubeletPort=port)
        private_directory(state.cluster(key))
        publish(state.engine_file(key), endpoint)
        return endpoint

    async def stop_engine(self, key: str) -> None:
        engine = self.engines.pop(key, None)
        if engine is not None:
            await engine.stop()

    async def stop_all(self) -> None:
        for key in list(self.engines):
            await self.stop_engine(key)
        for process in self.kueue.processes.values():
            await process.stop()
        self.kueue.processes.clear()
        for process in self.metrics_servers.processes.values():
            await process.stop()
        self.metrics_servers.processes.clear()


def engine_host_arguments(host: HostConfig) -> list[str]:
    """How an engine reaches the host cluster: as the operator does (the same kubeconfig, or
    the same service account of the pod both run in)."""
    if host.kubeconfig is not None:
        return ["--host-kubeconfig", str(host.kubeconfig)]
    return ["--host-in-cluster", "--service-account-dir", str(host.service_account_dir)]


@dataclasses.dataclass
class ToolBuild:
    """An add-on's binary, built once for every member in a thread while reconciles report it
    in the member's condition. Nothing of it needs to survive a restart: the cache has the
    binary or not, and a new operator builds again."""

    title: str
    find: Callable[[], Path | None]
    ensure: Callable[..., Path]
    future: asyncio.Future[Path] | None = None
    started: float = 0.0
    error: str = ""
    failed_at: float = 0.0

    def observe(self) -> tuple[bool, str, float | None]:
        """Whether the binary is there; why it is not (a failed build, forgotten after
        :data:`BUILD_RETRY` so that the plan builds again, or an override that names no
        binary); how long the build has been running (None: none runs)."""
        if self.error and time.monotonic() - self.failed_at > BUILD_RETRY:
            self.error = ""
        try:
            found, error = self.find() is not None, self.error
        except ControlPlaneError as problem:  # an override that names no binary
            found, error = False, str(problem)
        running = self.future is not None and not self.future.done()
        return found, error, time.monotonic() - self.started if running else None

    def start(self) -> None:
        """Build in a thread, unless a build runs already."""
        if self.future is not None and not self.future.done():
            return
        self.started, self.error = time.monotonic(), ""
        self.future = asyncio.ensure_future(asyncio.to_thread(
            self.ensure, progress=lambda line: logger.info("%s", line)))
        self.future.add_done_callback(self._finished)

    def _finished(self, done: asyncio.Future[Path]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None:
            self.error, self.failed_at = str(error), time.monotonic()
            logger.error("building %s failed: %s", self.title, error)


@dataclasses.dataclass
class KueueAddons:
    """What the operator holds in memory of the Kueue add-ons; all of it is observed again
    (or redone, idempotently) after a restart."""

    processes: dict[str, Supervised] = dataclasses.field(default_factory=dict)
    #: Members whose webhook configurations were applied since their Kueue started.
    hooked: set[str] = dataclasses.field(default_factory=set)
    #: Fingerprint of the MultiKueue objects last applied to each manager.
    applied: dict[str, str] = dataclasses.field(default_factory=dict)
    build: ToolBuild = dataclasses.field(default_factory=lambda: ToolBuild(
        "Kueue", kueue_building.find, kueue_building.ensure))
    #: Kueue's manifests from its module source, read once.
    manifests: Manifests | None = None


@dataclasses.dataclass
class MetricsServerAddons:
    """What the operator holds in memory of the metrics-servers; all of it is observed again
    (or redone, idempotently) after a restart."""

    processes: dict[str, Supervised] = dataclasses.field(default_factory=dict)
    #: Members whose Service and APIService were applied since their metrics-server started.
    hooked: set[str] = dataclasses.field(default_factory=set)
    #: The resolution each running metrics-server was started with.
    resolutions: dict[str, str] = dataclasses.field(default_factory=dict)
    build: ToolBuild = dataclasses.field(default_factory=lambda: ToolBuild(
        "metrics-server", metricsserver_building.find, metricsserver_building.ensure))
    #: Its RBAC and APIService from its module source, read once.
    manifests: metricsserver_source.Manifests | None = None


async def wait_until_none(count: Callable[[], Awaitable[int]], timeout: float) -> int:
    """Ask ``count`` (say, how many fake nodes the member API still shows) until it says 0 or
    ``timeout`` seconds passed; what is left."""
    deadline = time.monotonic() + timeout
    while (left := await count()) and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
    return left
