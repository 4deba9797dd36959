"""What the handlers work with, passed to them through kopf's ``memo`` (never globals)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from opentelemetry import trace

from operators.addons.building import ToolBuild
from operators.addons.registry import runners
from operators.addons.running import Runner
from operators.controlplane import binaries as binaries_
from operators.controlplane import health
from operators.controlplane.binaries import Binaries
from operators.controlplane.components import Profile
from operators.controlplane.errors import BinaryError
from operators.controlplane.state import (
    EngineEndpoint,
    StateDir,
    choose_engine_endpoint,
    read_engine_endpoint,
)
from operators.controlplane.substrate import Substrate
from operators.controlplane.supervising import Supervised
from operators.faults.evaluating import CelWorkers
from operators.k8s.client import Client
from operators.k8s.config import ClusterAccess, HostConfig
from operators.reconciling.clusters import HubState, Release

logger = logging.getLogger(__name__)

#: An engine that ran this long is healthy: its next crash restarts it after the shortest wait.
ENGINE_STABLE_AFTER = 60.0


@dataclasses.dataclass
class Member:
    """How the operator reaches a member cluster, and the kubeconfig its engine reads."""

    access: ClusterAccess
    kubeconfig: Path


class Releases:
    """The Kubernetes releases FakeClusters' ``kubernetesVersion`` asks for: found in the cache,
    or built there in the background, one at a time (each takes both cores for minutes), while
    the clusters' statuses say what is being built and how long it usually takes."""

    def __init__(self, resolve: Callable[..., Binaries]) -> None:
        self._resolve = resolve
        self._builds: dict[str, ToolBuild] = {}
        self._slot = asyncio.Semaphore(1)

    def binaries(self, version: str) -> Binaries | None:
        """The release's binaries if the cache (or an override) has them."""
        try:
            return self._resolve(version, allow_build=False)
        except BinaryError:
            return None

    def observe(self, version: str) -> Release | None:
        """None when the release is there; else how its build goes."""
        build = self._builds.get(version)
        if build is None:
            return None if self.binaries(version) is not None else Release(version)
        found, error, building_for = build.observe()
        if found:
            return None
        ahead = next((other for other, each in self._builds.items()
                      if other != version and each.future is not None
                      and not each.future.done() and not each.waiting), "")
        return Release(version, building_for=building_for, error=error,
                       waiting_for=ahead if build.waiting else "", usual=usual_build())

    def start(self, version: str) -> None:
        build = self._builds.get(version)
        if build is None:
            build = self._builds[version] = ToolBuild(
                f"Kubernetes {version}",
                find=lambda: _apiserver(self.binaries(version)),
                ensure=lambda progress: self._resolve(version, progress=progress).kube_apiserver,
                slot=self._slot)
        build.start()


def _apiserver(binaries: Binaries | None) -> Path | None:
    return binaries.kube_apiserver if binaries is not None else None


def usual_build() -> float | None:
    """How long the builds of Kubernetes in this cache took (the median, in seconds; None
    before the first)."""
    taken = []
    for manifest in (binaries_.cache_root() / "kubernetes").glob("*/manifest.json"):
        try:
            taken.append(float(json.loads(manifest.read_text())["buildSeconds"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return statistics.median(taken) if taken else None


@dataclasses.dataclass
class Runtime:
    """The operator's dependencies and its in-memory view of the member clusters."""

    state_dir: Path
    host: Client
    #: Where the host's credentials come from: kopf logs in with it, engines are given it.
    host_config: HostConfig
    substrate: Substrate
    #: Finds (or with ``allow_build``, builds) the binaries of a Kubernetes release:
    #: :func:`operators.controlplane.binaries.resolve`.
    resolve_binaries: Callable[..., Binaries]
    external: dict[str, Member] = dataclasses.field(default_factory=dict)
    engines: dict[str, Supervised] = dataclasses.field(default_factory=dict)
    #: Each member's API server version, and when it last said so (time.monotonic()).
    versions: dict[str, tuple[str, float]] = dataclasses.field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = dataclasses.field(default_factory=dict)
    #: FaultPlans whose daemon runs now (namespace/name): their finalizer waits for it.
    plans: set[str] = dataclasses.field(default_factory=set)
    #: Each member's hub link, as its daemon last saw it (the HubConnected condition).
    hub_links: dict[str, HubState] = dataclasses.field(default_factory=dict)
    #: Every add-on, its one background build and its process on each member.
    addons: tuple[Runner[Any, Any], ...] = dataclasses.field(default_factory=runners)
    #: The worker processes that judge every plan's CEL expectations (started when needed).
    cel: CelWorkers = dataclasses.field(default_factory=CelWorkers)
    #: Makes the handlers' spans: the entry point passes its configured provider's; the
    #: default is the API's global one (no spans until an SDK is configured).
    tracer: trace.Tracer = dataclasses.field(
        default_factory=lambda: trace.get_tracer("operators.handlers"))
    #: The profile of FakeClusters whose spec.controlPlane.profile is not set.
    default_profile: Profile = Profile.DEFAULT
    #: The child subreaper (the daemon of ``fakefleet up``) that engines and add-ons are
    #: detached to, so that they outlive the operator; None: they die with it.
    subreaper: int | None = None

    def __post_init__(self) -> None:
        #: The releases FakeClusters ask for, built one at a time.
        self.releases = Releases(self.resolve_binaries)

    def lock(self, key: str) -> asyncio.Lock:
        """One reconciliation at a time per object (change handlers and timers overlap)."""
        return self.locks.setdefault(key, asyncio.Lock())

    def engine_running(self, key: str) -> bool:
        engine = self.engines.get(key)
        return engine is not None and engine.running

    async def start_engine(self, key: str, namespace: str, name: str,
                           member_kubeconfig: Path, *,
                           kubelet_pki: Path | None = None,
                           node_grace: float | None = None) -> Supervised:
        """The cluster's engine process, supervised: its log in the cluster's directory,
        restarted with back-off (reset after a healthy minute) when it dies. One that an
        earlier operator left running with the same command line is adopted if it answers
        on its kubelet port. ``kubelet_pki``: the member's kubelet PKI, with which it serves
        the kubelet API over TLS (None: an adopted cluster, whose API server fakefleet cannot
        give the flags to reach it). ``node_grace``: the member's node-lifecycle controller's
        grace period in seconds, by which the engine paces Lease renewals (None: its
        default)."""
        engine = self.engines.get(key)
        if engine is not None:
            return engine
        endpoint = choose_engine_endpoint(StateDir(self.state_dir), key)  # both ports set
        tls = ["--kubelet-tls-port", str(endpoint.kubeletTlsPort),
               "--kubelet-pki", str(kubelet_pki)] if kubelet_pki is not None else []
        grace = ["--node-monitor-grace", f"{node_grace:g}"] if node_grace is not None else []
        engine = Supervised(
            f"{key}/engine",
            [sys.executable, "-m", "operators.engine", "--kubeconfig", str(member_kubeconfig),
             *engine_host_arguments(self.host_config), "--cluster", f"{namespace}/{name}",
             "--kubelet-port", str(endpoint.kubeletPort), *tls, *grace],
            log_path=StateDir(self.state_dir).engine_log(key),
            stable_after=ENGINE_STABLE_AFTER, death_signal=signal.SIGTERM,
            subreaper=self.subreaper,
        )
        if not await health.adopt(engine, f"http://127.0.0.1:{endpoint.kubeletPort}/healthz"):
            await engine.start()
        self.engines[key] = engine
        return engine

    def engine_endpoint(self, key: str, *, choose: bool = False) -> EngineEndpoint | None:
        """Where the member's engine serves its nodes' kubelets and DCGM metrics: the ports it
        had, which its nodes advertise, or with ``choose`` free ones if there are none yet
        (:func:`~operators.controlplane.state.choose_engine_endpoint`)."""
        state = StateDir(self.state_dir)
        if choose:
            return choose_engine_endpoint(state, key)
        return read_engine_endpoint(state, key)

    async def stop_engine(self, key: str) -> None:
        engine = self.engines.pop(key, None)
        if engine is not None:
            await engine.stop()

    async def stop_all(self) -> None:
        """The operator is going: the CEL workers, every add-on and every engine stop, each
        of them also when another one's stop failed or was cancelled."""
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(self.cel.close)
            for runner in self.addons:
                stack.push_async_callback(runner.stop_all)
            for key in list(self.engines):
                stack.push_async_callback(self.stop_engine, key)


def engine_host_arguments(host: HostConfig) -> list[str]:
    """How an engine reaches the host cluster: as the operator does (the same kubeconfig, or
    the same service account of the pod both run in)."""
    if host.kubeconfig is not None:
        return ["--host-kubeconfig", str(host.kubeconfig)]
    return ["--host-in-cluster", "--service-account-dir", str(host.service_account_dir)]


async def wait_until_none(count: Callable[[], Awaitable[int]], timeout: float) -> int:
    """Ask ``count`` (say, how many fake nodes the member API still shows) until it says 0 or
    ``timeout`` seconds passed; what is left."""
    deadline = time.monotonic() + timeout
    while (left := await count()) and time.monotonic() < deadline:
        await asyncio.sleep(1.0)
    return left
