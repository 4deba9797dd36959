"""The background process behind ``fakefleet up``: it owns the host control plane.

``fakefleet up`` returns once the host cluster is Ready, but someone has to keep etcd, the
kube-apiserver, the scheduler, the controller-manager and the operator
(``python -m operators``) alive afterwards and restart them when they crash: this daemon.
It also runs the embedded trace collector (``python -m federation.telemetry.collector``) first,
and points the OpenTelemetry exporters of the hub and the operator (and so of the engines) at
it, unless the user named an endpoint of their own (``OTEL_EXPORTER_OTLP_ENDPOINT``) or turned
the collector off (``FAKEFLEET_COLLECTOR=off``); etcd and the host's kube-apiserver send their
spans to the same endpoint.
It holds ``<state>/daemon.lock`` for its whole life (so there is never a second one on the
same state directory), publishes what it runs in ``<state>/host.json``, and stops everything
on SIGTERM/SIGINT. Its children die with it even when it is SIGKILLed.

It is a child subreaper (:mod:`~operators.controlplane.reaping`), and tells the operator so
(:data:`~operators.controlplane.detaching.SUBREAPER`): the operator starts the members'
processes detached, as children of the daemon, so that they outlive a killed operator and its
successor adopts them; they still die with the daemon. Stopping, the daemon SIGTERMs the
operator, which stops its members, then stops what the operator left running.

:func:`run` is the embeddable core; ``python -m operators.controlplane.daemon`` is its entry.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO

from federation.client.discovery import HubFiles, HubInfo
from federation.telemetry.exporting import exporter_environment
from federation.telemetry.files import CollectorFiles, CollectorInfo
from operators.controlplane import binaries as binaries_
from operators.controlplane.components import Profile
from operators.controlplane.detaching import SUBREAPER
from operators.controlplane.errors import (
    ControlPlaneError,
    PortInUseError,
    StartupError,
    StateError,
)
from operators.controlplane.pki import ensure_hub_pki
from operators.controlplane.ports import claim_port, free_port
from operators.controlplane.processes import own_children
from operators.controlplane.reaping import become_subreaper, keep_reaping, stop_orphans
from operators.controlplane.state import (
    HOST_CLUSTER,
    ComponentState,
    HostState,
    StateDir,
    publish,
    read_host,
    read_operator,
)
from operators.controlplane.substrate import ClusterOptions, Substrate
from operators.controlplane.supervising import Supervised, tail
from primitives.files import private_directory
from primitives.flags import integer, number

logger = logging.getLogger(__name__)

#: ``off`` keeps ``fakefleet up`` from starting the embedded collector.
COLLECTOR_VARIABLE = "FAKEFLEET_COLLECTOR"
#: How long the members that the operator left running get after SIGTERM (s).
ORPHANS_STOP = 15.0


@dataclasses.dataclass(frozen=True)
class HostSettings:
    """What ``fakefleet up`` asked for."""

    state_dir: Path
    version: str = binaries_.DEFAULT_KUBERNETES_VERSION
    apiserver_port: int | None = None
    profile: Profile = Profile.DEFAULT
    startup_timeout: float = 90.0
    operator: bool = True
    hub: bool = True
    collector: bool = True
    fsync: bool = True


def collector_wanted(environ: Mapping[str, str]) -> bool:
    """What ``FAKEFLEET_COLLECTOR`` says: ``on`` (or unset) or ``off``."""
    value = environ.get(COLLECTOR_VARIABLE, "on").strip().lower()
    if value not in ("on", "off"):
        raise StateError(f"{COLLECTOR_VARIABLE}={environ[COLLECTOR_VARIABLE]!r} is neither "
                         f"'on' nor 'off': set it to 'off' to run without the embedded trace "
                         f"collector, or unset it")
    return value == "on"


def daemon_alive(state_dir: Path) -> bool:
    """Whether a daemon holds the lock of ``state_dir`` right now."""
    try:
        with _lock(state_dir, blocking=False):
            return False
    except StateError:
        return True


@contextlib.contextmanager
def _lock(state_dir: Path, *, blocking: bool) -> Iterator[IO[str]]:
    with StateDir(state_dir).create().daemon_lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError as error:
            raise StateError(
                f"another fakefleet daemon already runs on {state_dir}: use 'fakefleet status' "
                f"to see it or 'fakefleet down' to stop it"
            ) from error
        yield handle


def _snapshot(substrate: Substrate, settings: HostSettings, started: str,
              operator: Supervised | None, hub: Supervised | None,
              collector: Supervised | None) -> HostState:
    host = substrate.clusters.get(HOST_CLUSTER)
    components = substrate.components()
    if collector is not None:
        serving = CollectorInfo.read(CollectorFiles.of(settings.state_dir).info)
        components.append(ComponentState(
            cluster=None, name="collector", pid=collector.pid, log=str(collector.log_path),
            restarts=collector.restarts,
            port=serving.port if serving and serving.pid == collector.pid else None))
    if hub is not None:
        info = HubInfo.read(HubFiles(StateDir(settings.state_dir).hub).info)
        components.append(ComponentState(
            cluster=None, name="hub", pid=hub.pid, log=str(hub.log_path), restarts=hub.restarts,
            port=int(info.address.rsplit(":", 1)[1]) if info and info.pid == hub.pid else None))
    if operator is not None:
        components.append(ComponentState(cluster=None, name="operator", pid=operator.pid,
                                         log=str(operator.log_path),
                                         restarts=operator.restarts))
    return HostState(
        pid=os.getpid(), ready=host is not None, startedAt=started,
        kubernetesVersion=settings.version, profile=str(settings.profile),
        endpoint=host.endpoint if host else None,
        kubeconfig=str(host.kubeconfig_path) if host else None, components=components,
    )


def operator_ready(state_dir: Path, pid: int | None) -> bool:
    """Whether the operator with ``pid`` announced that its handlers run."""
    announced = read_operator(StateDir(state_dir))
    return pid is not None and announced is not None and announced.ready and \
        announced.pid == pid


async def _start_operator(state_dir: Path, timeout: float,
                          env: Mapping[str, str]) -> Supervised:
    """The operator runs as a supervised child: killed, it is restarted (and adopts)."""
    StateDir(state_dir).operator_file.unlink(missing_ok=True)
    operator = Supervised(
        "operator",
        [sys.executable, "-m", "operators", "--state-dir", str(state_dir), "--install-crds",
         "--kubeconfig", str(StateDir(state_dir).host_kubeconfig)],
        log_path=StateDir(state_dir).operator_log,
        death_signal=signal.SIGTERM,  # it stops its members and engines, within a bound
        env=env,
    )
    await operator.start()
    deadline = time.monotonic() + timeout
    while not operator_ready(state_dir, operator.pid):
        if operator.restarts or not operator.running:
            await operator.stop()
            raise StartupError("the operator", "exited during start-up", tail(operator.log_path))
        if time.monotonic() > deadline:
            await operator.stop()
            raise StartupError("the operator", f"was not ready after {timeout:.0f}s",
                               tail(operator.log_path))
        await asyncio.sleep(0.1)
    return operator


def _hub_port(state: StateDir) -> int:
    """The hub's port: the one it had (members find it again after a restart), else a free
    one, remembered."""
    return _remembered_port(state.hub / "port")


def _remembered_port(remembered: Path) -> int:
    """The port written in ``remembered`` if it is free, else a free one, written there."""
    with contextlib.suppress(FileNotFoundError, ValueError, PortInUseError):
        return claim_port(int(remembered.read_text()), str(remembered))
    port = free_port()
    remembered.write_text(f"{port}\n")
    return port


async def _start_collector(state_dir: Path, timeout: float,
                           fsync: bool) -> tuple[Supervised, CollectorInfo]:
    """The trace collector, supervised, on loopback, on the port it had before (processes
    that outlive a restart of it keep exporting to the address they were given)."""
    files = CollectorFiles.of(state_dir)
    private_directory(files.directory)
    files.info.unlink(missing_ok=True)
    command = [sys.executable, "-m", "federation.telemetry.collector",
               "--state-dir", str(files.directory),
               "--listen", f"127.0.0.1:{_remembered_port(files.port)}"]
    if not fsync:
        command.append("--unsafe-no-fsync")
    collector = Supervised("collector", command, log_path=files.log,
                           death_signal=signal.SIGTERM)
    await collector.start()
    deadline = time.monotonic() + timeout
    while (info := CollectorInfo.read(files.info)) is None or info.pid != collector.pid:
        if collector.restarts or not collector.running:
            await collector.stop()
            raise StartupError("the trace collector", "exited during start-up",
                               tail(collector.log_path))
        if time.monotonic() > deadline:
            await collector.stop()
            raise StartupError("the trace collector", f"was not serving after {timeout:.0f}s",
                               tail(collector.log_path))
        await asyncio.sleep(0.1)
    return collector, info


async def start_hub(state_dir: Path, timeout: float, fsync: bool,
                     env: Mapping[str, str]) -> Supervised:
    """The federation hub, supervised, on loopback with TLS from its own PKI (the daemon's, or
    the operator's with --hub when it runs without a daemon)."""
    state = StateDir(state_dir)
    private_directory(state.hub)
    pki = ensure_hub_pki(state.hub_pki)
    files = HubFiles(state.hub)
    files.info.unlink(missing_ok=True)
    command = [sys.executable, "-m", "federation.hub", "--state-dir", str(state.hub),
               "--listen", f"127.0.0.1:{_hub_port(state)}",
               "--tls-cert", str(pki.serving_cert), "--tls-key", str(pki.serving_key),
               "--tls-ca", str(pki.ca_cert)]
    if not fsync:
        command.append("--unsafe-no-fsync")
    hub = Supervised("hub", command, log_path=state.hub_log, death_signal=signal.SIGTERM,
                     env=env)
    await hub.start()
    deadline = time.monotonic() + timeout
    while (info := HubInfo.read(files.info)) is None or info.pid != hub.pid:
        if hub.restarts or not hub.running:
            await hub.stop()
            raise StartupError("the hub", "exited during start-up", tail(hub.log_path))
        if time.monotonic() > deadline:
            await hub.stop()
            raise StartupError("the hub", f"was not serving after {timeout:.0f}s",
                               tail(hub.log_path))
        await asyncio.sleep(0.1)
    return hub


async def run(
    settings: HostSettings,
    *,
    stop_flag: asyncio.Event,
    ready_flag: asyncio.Event | None = None,
    publish_interval: float = 1.0,
) -> None:
    """Run the host control plane until ``stop_flag`` is set; everything is stopped on return."""
    state_dir = settings.state_dir
    state = StateDir(state_dir)
    with _lock(state_dir, blocking=False):
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        binaries = binaries_.resolve(settings.version, allow_build=False)
        substrate: Substrate | None = None
        operator: Supervised | None = None
        hub: Supervised | None = None
        collector: Supervised | None = None
        env: dict[str, str] = {}
        become_subreaper()
        reaper = asyncio.create_task(keep_reaping(own_children), name="reaping orphans")
        try:
            if settings.collector:
                collector, serving = await _start_collector(
                    state_dir, settings.startup_timeout, settings.fsync)
                env = exporter_environment(serving.endpoint, os.environ)
            # etcd and the host's kube-apiserver send spans where the children do.
            substrate = Substrate(state_dir, binaries, fsync=settings.fsync,
                                  startup_timeout=settings.startup_timeout,
                                  environ={**os.environ, **env})
            await substrate.start()
            await substrate.add_cluster(HOST_CLUSTER, ClusterOptions(
                apiserver_port=settings.apiserver_port, profile=settings.profile,
            ))
            if settings.hub:
                hub = await start_hub(state_dir, settings.startup_timeout, settings.fsync,
                                       env)
            if settings.operator:
                operator = await _start_operator(state_dir, settings.startup_timeout,
                                                 {**env, SUBREAPER: str(os.getpid())})
            if ready_flag is not None:
                ready_flag.set()
            running = substrate
            await keep_publishing(
                state.host_file,
                lambda: _snapshot(running, settings, started, operator, hub, collector),
                stop_flag=stop_flag, interval=publish_interval)
        except ControlPlaneError as error:
            publish(state.host_file, HostState(pid=os.getpid(), error=str(error)))
            raise
        finally:
            if operator is not None:
                await operator.stop(timeout=30)
            # Members it could not stop (it was killed, and its successor not yet running).
            await stop_orphans(own_children, timeout=ORPHANS_STOP)
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            become_subreaper(False)
            if hub is not None:
                await hub.stop(timeout=10)
            if substrate is not None:
                await substrate.stop()
            if collector is not None:  # last: it receives the others' final spans
                await collector.stop(timeout=10)
            if (published := read_host(state)) is None or published.error is None:
                state.host_file.unlink(missing_ok=True)


async def keep_publishing(path: Path, snapshot: Callable[[], HostState], *,
                          stop_flag: asyncio.Event, interval: float) -> None:
    """Publish what runs at ``path`` every ``interval`` until ``stop_flag`` is set. A write
    that fails (a full disk) is logged, once until it succeeds again, and tried on the next
    round: the control plane it describes keeps running, and ``fakefleet status`` reads the
    last file that was written."""
    failing = ""
    while not stop_flag.is_set():
        try:
            publish(path, snapshot())
        except OSError as error:
            if str(error) != failing:
                logger.error("cannot publish %s (%s): fakefleet status shows what was last "
                             "written; everything keeps running", path, error)
            failing = str(error)
        else:
            if failing:
                logger.info("%s is published again", path)
            failing = ""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop_flag.wait(), interval)


async def _main_async(settings: HostSettings) -> int:
    stop_flag = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_flag.set)
    try:
        await run(settings, stop_flag=stop_flag)
    except ControlPlaneError as error:
        logger.error("%s", error)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operators.controlplane.daemon")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubernetes-version", default=binaries_.DEFAULT_KUBERNETES_VERSION)
    parser.add_argument("--port", type=integer(1, 65535, "a port"), default=None,
                        help="the host kube-apiserver's port (default: a free one)")
    parser.add_argument("--profile", choices=[p.value for p in Profile], default="default")
    parser.add_argument("--startup-timeout", type=number(1, 3600, "a number of seconds"),
                        default=90.0,
                        help="seconds each component has to become healthy, from 1 to 3600")
    parser.add_argument("--no-operator", action="store_true",
                        help="run only the host control plane")
    parser.add_argument("--no-hub", action="store_true",
                        help="do not start the federation hub")
    parser.add_argument("--no-collector", action="store_true",
                        help="do not start the embedded trace collector (also: "
                             f"{COLLECTOR_VARIABLE}=off)")
    parser.add_argument("--unsafe-no-fsync", action="store_true",
                        help="for tests and benchmarks: etcd does not fsync, so data may be "
                             "lost on a machine crash")
    args = parser.parse_args(argv)
    try:
        collector = not args.no_collector and collector_wanted(os.environ)
    except StateError as error:
        parser.error(str(error))
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = HostSettings(
        state_dir=args.state_dir.resolve(),
        version=args.kubernetes_version,
        apiserver_port=args.port,
        profile=Profile(args.profile),
        startup_timeout=args.startup_timeout,
        operator=not args.no_operator,
        hub=not args.no_hub,
        collector=collector,
        fsync=not args.unsafe_no_fsync,
    )
    return asyncio.run(_main_async(settings))


if __name__ == "__main__":
    sys.exit(main())
