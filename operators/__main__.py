"""``python -m operators``: the fakefleet operator as a process.

It watches FakeCluster and FakeNodePool in the host cluster, runs the member control planes on
the shared etcd of ``--state-dir`` (or on an etcd of its own when there is none, e.g. when the
host is a real cluster), and one engine per member. One operator per state directory: a second
one refuses to start.

Under the daemon of ``fakefleet up`` (its parent, which says so in ``FAKEFLEET_SUBREAPER``) the
member processes (control planes, add-ons, engines) are detached to the daemon: killed, the
operator leaves them running and the next one adopts them, so a member's API never stops
answering; stopped (SIGTERM, Ctrl-C), it stops them first. Without that daemon (run by hand,
or in the Helm chart's pod) they die with the operator, and the next one starts them again on
the same ports and data.

The host cluster: ``--kubeconfig``; without it, in a pod (``KUBERNETES_SERVICE_HOST`` set),
the pod's service account; else the host cluster of ``--state-dir``. Before it starts it asks
the host whether it may do all it needs (:mod:`operators.handlers.permissions`) and refuses to
run, naming what it lacks, if not. ``--namespace`` (repeatable) narrows it to those namespaces
(a Role in each is enough); ``--hub`` runs a federation hub beside it when no ``fakefleet up``
daemon provides one (the chart's way).
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opentelemetry import trace

from federation.telemetry import setup
from operators.api import RESOURCES
from operators.api.crdgen import crd
from operators.controlplane import binaries as binaries_
from operators.controlplane import detaching
from operators.controlplane.components import Profile
from operators.controlplane.daemon import daemon_alive, start_hub
from operators.controlplane.errors import ControlPlaneError, StateError
from operators.controlplane.etcd import shared_etcd
from operators.controlplane.state import ComponentState, OperatorState, StateDir, publish
from operators.controlplane.substrate import Substrate
from operators.faults.evaluating import CelWorkers, Limits
from operators.handlers import addons, permissions, registry
from operators.handlers.runtime import Runtime
from operators.k8s.applying import install_crds
from operators.k8s.client import Client
from operators.k8s.config import SERVICE_ACCOUNT_DIR, HostConfig, in_cluster
from operators.k8s.errors import ApiError, K8sError
from primitives.flags import integer, number
from primitives.tasks import spawn

logger = logging.getLogger("operators")

SERVICE_NAME = "fakefleet-operator"
#: How long kopf gets to stop once asked (s): longer than it takes to stop every daemon
#: (``registry.DAEMON_STOP``), so that it ends them and closes its clients itself; shorter than
#: what ``fakefleet up``'s daemon gives the operator before SIGKILL (30 s).
SHUTDOWN_GRACE = 10.0
PUBLISH_INTERVAL = 1.0
HUB_STARTUP_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True)
class Options:
    """What the command line asks of the operator."""

    state_dir: Path
    host: HostConfig
    install: bool = False
    fsync: bool = True
    namespaces: tuple[str, ...] = ()
    hub: bool = False
    default_profile: Profile = Profile.DEFAULT
    #: host:port of kopf's health endpoint (/healthz), for a pod's probes; None: none.
    liveness: str | None = None
    #: What judging one CEL expectation may cost (docs/faults.md, "The CEL budget").
    cel: Limits = dataclasses.field(default_factory=Limits)


async def check_access(host: Client, options: Options) -> None:
    """Refuse to start without the access the operator needs (it would fail halfway)."""
    wanted = permissions.accesses(namespaces=options.namespaces, install_crds=options.install)
    try:
        lacking = await permissions.missing(host, wanted)
    except ApiError as error:  # an API server that cannot say: the handlers will find out
        logger.warning("cannot check the operator's permissions (%s); starting anyway", error)
        return
    if lacking:
        raise StateError(permissions.refusal(lacking, options.host.describe()))
    logger.info("the host cluster allows all %d actions the operator needs (%s)", len(wanted),
                options.host.describe())


async def serve(options: Options, *, tracer: trace.Tracer) -> None:
    state_dir = options.state_dir
    binaries = binaries_.resolve(allow_build=False)
    # The daemon's etcd while a daemon runs (`fakefleet up`); else (a real host cluster) the
    # operator runs its own, also when an earlier operator's etcd left its files behind.
    alive = daemon_alive(state_dir)
    etcd = shared_etcd(state_dir) if alive else None
    subreaper = detaching.subreaper(os.environ, os.getppid())
    if subreaper is not None:
        logger.info("member processes are detached to the daemon (pid %d): they outlive this "
                    "operator unless it is stopped, and the next one adopts them", subreaper)
    else:
        logger.info("member processes die with this operator (no fakefleet up daemon is its "
                    "parent)")
    substrate = Substrate(state_dir, binaries, etcd=etcd, fsync=options.fsync,
                          subreaper=subreaper)
    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_flag.set)
    # Every client, process and file the operator holds is let go on every way out (an error,
    # a cancellation), each also when letting go of another failed: last in, first out.
    async with contextlib.AsyncExitStack() as held:
        host = Client.connect(options.host.load())
        held.push_async_callback(host.close)
        held.push_async_callback(substrate.stop)
        held.callback(StateDir(state_dir).operator_file.unlink, missing_ok=True)
        await check_access(host, options)
        await substrate.start()
        if options.hub and not alive:
            hub = await start_hub(state_dir, HUB_STARTUP_TIMEOUT, options.fsync, os.environ)
            held.push_async_callback(hub.stop)
        if options.install:
            await install_crds(host, [crd(model) for model in RESOURCES])
        runtime = Runtime(
            state_dir=state_dir, host=host, host_config=options.host,
            substrate=substrate, resolve_binaries=binaries_.resolve,
            tracer=tracer, default_profile=options.default_profile,
            cel=CelWorkers(options.cel), subreaper=subreaper,
        )
        announce = spawn("publishing the operator's state",
                         lambda: _publish(runtime, ready_flag))
        held.push_async_callback(_cancelled, announce)
        operator = asyncio.create_task(registry.run(
            runtime=runtime, stop_flag=stop_flag, ready_flag=ready_flag,
            namespaces=options.namespaces,
            liveness_endpoint=f"http://{options.liveness}/healthz" if options.liveness else None))
        held.push_async_callback(_cancelled, operator)
        stopping = asyncio.create_task(stop_flag.wait())
        held.push_async_callback(_cancelled, stopping)
        await asyncio.wait({operator, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not operator.done():
            # kopf stops its daemons within registry.DAEMON_STOP and closes its own clients,
            # but retries against a host API server that may be going down with us (the
            # daemon stops both): bound the wait, then cancel.
            done, _ = await asyncio.wait({operator}, timeout=SHUTDOWN_GRACE)
            if not done:
                logger.warning("the operator did not stop within %.0fs; cancelling it",
                               SHUTDOWN_GRACE)
        await _cancelled(operator)
        operator.result()


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """``task`` cancelled unless it is done, and waited for."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _publish(runtime: Runtime, ready_flag: asyncio.Event) -> None:
    """Once the handlers run, say so, and keep saying what runs: the members' control
    planes and their engines (``fakefleet status`` lists them)."""
    await ready_flag.wait()
    path = StateDir(runtime.state_dir).operator_file
    while True:
        engines = []
        for key, engine in runtime.engines.items():
            endpoint = runtime.engine_endpoint(key)
            engines.append(ComponentState(
                cluster=key, name="engine", pid=engine.pid, log=str(engine.log_path),
                restarts=engine.restarts, port=endpoint.kubeletPort if endpoint else None,
                healthUrl=f"http://127.0.0.1:{endpoint.kubeletPort}/healthz" if endpoint
                else None))
        try:
            publish(path, OperatorState(pid=os.getpid(), ready=True, components=[
                *runtime.substrate.components(), *engines, *addons.components(runtime)]))
        except OSError as error:  # a full disk, say: `fakefleet status` goes stale, not dark
            logger.warning("cannot write %s: %s", path, error)
        await asyncio.sleep(PUBLISH_INTERVAL)


def choose_host(kubeconfig: Path | None, service_account_dir: Path, state: StateDir,
                environ: Mapping[str, str] | None = None) -> HostConfig:
    """``--kubeconfig``; else, in a pod, its service account; else the state dir's host."""
    if kubeconfig is not None:
        return HostConfig(kubeconfig=kubeconfig.resolve())
    if in_cluster(environ):
        return HostConfig(service_account_dir=service_account_dir.resolve())
    return HostConfig(kubeconfig=state.host_kubeconfig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operators", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="host cluster kubeconfig (default: in a pod, its service "
                             "account; else the state dir's host cluster)")
    parser.add_argument("--service-account-dir", type=Path, default=SERVICE_ACCOUNT_DIR,
                        help="in a pod: where its service account's token, ca.crt and "
                             f"namespace are (default {SERVICE_ACCOUNT_DIR})")
    parser.add_argument("--namespace", action="append", default=[], dest="namespaces",
                        help="watch only this namespace (repeatable; default: all)")
    parser.add_argument("--hub", action="store_true",
                        help="run a federation hub beside the operator (on loopback, TLS "
                             "from a PKI in the state dir) unless a fakefleet up daemon runs one")
    parser.add_argument("--default-profile", choices=[p.value for p in Profile],
                        default=Profile.DEFAULT.value,
                        help="control-plane profile of FakeClusters whose "
                             "spec.controlPlane.profile is not set")
    parser.add_argument("--liveness", metavar="HOST:PORT", default=None,
                        help="serve kopf's health endpoint (/healthz) there, for a pod's "
                             "probes (default: none)")
    # Within what Limits accepts, so that no flag can make it refuse.
    parser.add_argument("--cel-budget-ms", type=number(1, 60_000, "a number of milliseconds"),
                        default=Limits.budget * 1000,
                        help="CPU time one object's evaluation of a FaultPlan's cel "
                             "expectation may take, from 1 to 60000 (default %(default)g ms)")
    parser.add_argument("--cel-memory-mib", type=integer(64, 1 << 20),
                        default=Limits.memory >> 20,
                        help="address space of each CEL worker process, from 64 to 2^20 "
                             "(default %(default)d MiB)")
    parser.add_argument("--install-crds", action="store_true",
                        help="apply the CRDs to the host cluster before starting")
    parser.add_argument("--unsafe-no-fsync", action="store_true",
                        help="for tests and benchmarks, when the operator runs its own etcd: "
                             "etcd does not fsync, so data may be lost on a machine crash")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # kopf logs every timer run at INFO
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    cel = Limits(budget=args.cel_budget_ms / 1000, memory=args.cel_memory_mib << 20)
    state_dir: Path = args.state_dir.resolve()
    state = StateDir(state_dir).create()
    host = choose_host(args.kubeconfig, args.service_account_dir, state)
    options = Options(state_dir=state_dir, host=host, install=args.install_crds,
                      fsync=not args.unsafe_no_fsync, namespaces=tuple(args.namespaces),
                      hub=args.hub, default_profile=Profile(args.default_profile),
                      liveness=args.liveness, cel=cel)
    with state.operator_lock.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.error("another operator already runs on %s", state_dir)
            return 1
        # The SDK, once, for the whole process (the handlers and the hub links in it); its
        # spans go where OTEL_EXPORTER_OTLP_ENDPOINT says (fakefleet up: its collector).
        provider = setup.configure(SERVICE_NAME)
        try:
            with contextlib.suppress(KeyboardInterrupt):
                asyncio.run(serve(options, tracer=provider.get_tracer("operators")))
        except (ControlPlaneError, K8sError, StateError) as error:
            logger.error("%s", error)
            return 1
        finally:
            setup.shutdown()  # the spans still buffered are exported before the process ends
    return 0


if __name__ == "__main__":
    sys.exit(main())
