"""``python -m operators``: the fakefleet operator as a process.

It watches FakeCluster and FakeNodePool in the host cluster, runs the member control planes on
the shared etcd of ``--state-dir`` (or on an etcd of its own when there is none, e.g. when the
host is a real cluster), and one engine per member. One operator per state directory: a second
one refuses to start. Member processes die with the operator and are restarted, on the same
ports and data, by the next one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import sys
from pathlib import Path

from opentelemetry import trace

from federation.telemetry import setup
from operators.api import RESOURCES
from operators.api.crdgen import crd
from operators.controlplane import binaries as binaries_
from operators.controlplane.daemon import daemon_alive
from operators.controlplane.errors import ControlPlaneError, StateError
from operators.controlplane.etcd import shared_etcd
from operators.controlplane.state import ComponentState, OperatorState, StateDir, publish
from operators.controlplane.substrate import Substrate
from operators.handlers import kueue, metricsserver, registry
from operators.handlers.runtime import Runtime
from operators.k8s.applying import install_crds
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError

logger = logging.getLogger("operators")

SERVICE_NAME = "fakefleet-operator"
SHUTDOWN_GRACE = 10.0
PUBLISH_INTERVAL = 1.0


async def serve(state_dir: Path, kubeconfig_path: Path, *, install: bool, fsync: bool,
                tracer: trace.Tracer) -> None:
    binaries = binaries_.resolve(allow_build=False)
    # The daemon's etcd while a daemon runs (`fakefleet up`); else (a real host cluster) the
    # operator runs its own, also when an earlier operator's etcd left its files behind.
    etcd = shared_etcd(state_dir) if daemon_alive(state_dir) else None
    substrate = Substrate(state_dir, binaries, etcd=etcd, fsync=fsync)
    host = Client.connect(load_kubeconfig_file(kubeconfig_path))
    stop_flag, ready_flag = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_flag.set)
    try:
        await substrate.start()
        if install:
            await install_crds(host, [crd(model) for model in RESOURCES])
        runtime = Runtime(
            state_dir=state_dir, host=host, host_kubeconfig=kubeconfig_path.resolve(),
            substrate=substrate, resolve_binaries=lambda version: binaries_.resolve(version),
            tracer=tracer,
        )
        announce = asyncio.create_task(_publish(runtime, ready_flag))
        operator = asyncio.create_task(registry.run(
            runtime=runtime, stop_flag=stop_flag, ready_flag=ready_flag))
        stopping = asyncio.create_task(stop_flag.wait())
        await asyncio.wait({operator, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        announce.cancel()
        if not operator.done():
            # kopf stops gracefully, but retries against a host API server that may be going
            # down with us (the daemon stops both): bound the wait, then cancel.
            done, _ = await asyncio.wait({operator}, timeout=SHUTDOWN_GRACE)
            if not done:
                logger.warning("the operator did not stop within %.0fs; cancelling it",
                               SHUTDOWN_GRACE)
                operator.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await operator
        operator.result()
    finally:
        StateDir(state_dir).operator_file.unlink(missing_ok=True)
        await substrate.stop()
        await host.close()


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
                *runtime.substrate.components(), *engines, *kueue.components(runtime),
                *metricsserver.components(runtime)]))
        except OSError as error:  # a full disk, say: `fakefleet status` goes stale, not dark
            logger.warning("cannot write %s: %s", path, error)
        await asyncio.sleep(PUBLISH_INTERVAL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operators", description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="host cluster kubeconfig (default: the state dir's host cluster)")
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
    state_dir: Path = args.state_dir.resolve()
    state = StateDir(state_dir).create()
    kubeconfig = args.kubeconfig or state.host_kubeconfig
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
                asyncio.run(serve(state_dir, kubeconfig, install=args.install_crds,
                                  fsync=not args.unsafe_no_fsync,
                                  tracer=provider.get_tracer("operators")))
        except (ControlPlaneError, K8sError, StateError) as error:
            logger.error("%s", error)
            return 1
        finally:
            setup.shutdown()  # the spans still buffered are exported before the process ends
    return 0


if __name__ == "__main__":
    sys.exit(main())
