"""``python -m operators.engine``: the engine of one member cluster, as a process.

Served by the operator, it takes its pools from the host cluster and writes their status::

    python -m operators.engine --kubeconfig MEMBER --host-kubeconfig HOST \\
        --cluster default/west

In a pod (the chart's operator), ``--host-in-cluster`` instead of ``--host-kubeconfig``: the
host is the pod's own cluster, reached with its service account (the token read again as the
kubelet rotates it).

Alone, it simulates the pools of its command line in any cluster (what the benchmark runs)::

    python -m operators.engine --kubeconfig member.kubeconfig --pool cpu=100 \\
        --pool gpu=8:H100-SXM5-80GB

``--stages FILE`` replaces the default lifecycles of pods and nodes, their log scripts, exec
scripts and port-forward rules (``kind: Lifecycle``). Every node's kubelet endpoints
(``/metrics/resource`` at the node's loopback InternalIP) and the cluster's DCGM metrics
(``http://127.0.0.1:PORT/metrics``) are served on ``--kubelet-port`` (default: a free port,
which the log names); ``--no-metrics`` serves and measures nothing. With ``--kubelet-pki DIR``
(the member's kubelet CA, which its API server trusts), the nodes' kubelet API (``kubectl
logs``, ``exec``, ``attach``, ``port-forward``) is served over TLS on ``--kubelet-tls-port``,
the port the nodes advertise.
SIGTERM or SIGINT stop it; whatever it made stays in the cluster for the next one to adopt.

Traces: the OpenTelemetry SDK is configured here, once (service ``fakefleet-engine``, resource
``k8s.cluster.name`` the FakeCluster's name), from the ``OTEL_*`` variables the operator passes
on; spans are flushed before the process exits. Only fault writes are traced
(:mod:`operators.engine.tracing`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from opentelemetry import trace
from pydantic import ValidationError

from federation.telemetry import setup
from operators.api.nodepools import FakeNodePoolSpec
from operators.api.stages import Lifecycle, StageError, load_lifecycle
from operators.controlplane.errors import StateError
from operators.controlplane.pki import KubeletPKI, load_authority
from operators.engine.alerting import NODE_GRACE
from operators.engine.pooling import ClusterRef
from operators.engine.running import ClusterEngine, EngineSettings
from operators.engine.scripting import Scripts
from operators.engine.serving import ServingError, raise_open_files
from operators.engine.stages import compile_lifecycle, default_lifecycle
from operators.k8s.client import Client
from operators.k8s.config import SERVICE_ACCOUNT_DIR, HostConfig, load_kubeconfig_file
from operators.k8s.errors import K8sError
from operators.k8s.transport import AiohttpTransport, SlowWrites
from primitives.flags import integer, number

logger = logging.getLogger("operators.engine")


def parse_pool(text: str, grace_cap: str) -> tuple[str, FakeNodePoolSpec]:
    """``NAME=REPLICAS[:GPU_PRESET[:ALLOCATION]]`` → a pool spec (validated like the CRD)."""
    name, _, rest = text.partition("=")
    replicas, _, gpu = rest.partition(":")
    preset, _, allocation = gpu.partition(":")
    if not name or not replicas.isdigit() or (allocation and not preset):
        raise argparse.ArgumentTypeError(
            f"--pool {text!r}: expected NAME=REPLICAS, NAME=REPLICAS:GPU_PRESET or "
            f"NAME=REPLICAS:GPU_PRESET:ALLOCATION, e.g. cpu=100 or h100=10:H100-SXM5-80GB:dra")
    spec: dict[str, object] = {"clusterRef": "-", "replicas": int(replicas),
                               "pods": {"terminationGracePeriodCap": grace_cap}}
    if preset:
        spec["gpu"] = {"preset": preset, **({"allocation": allocation} if allocation else {})}
    try:
        return name, FakeNodePoolSpec.model_validate(spec)
    except ValidationError as error:
        raise argparse.ArgumentTypeError(f"--pool {text!r}: {error}") from error


def parse_cluster(text: str) -> ClusterRef:
    namespace, _, name = text.rpartition("/")
    if not name:
        raise argparse.ArgumentTypeError(f"--cluster {text!r}: expected NAMESPACE/NAME")
    return ClusterRef(namespace or "default", name)


def host_of(args: argparse.Namespace) -> HostConfig | None:
    """Where the host cluster is: a kubeconfig, the pod's service account, or none (alone)."""
    if args.host_kubeconfig is not None:
        return HostConfig(kubeconfig=args.host_kubeconfig)
    if args.host_in_cluster:
        return HostConfig(service_account_dir=args.service_account_dir)
    return None


def cluster_name(args: argparse.Namespace) -> str:
    """What the engine's spans name as ``k8s.cluster.name``: the FakeCluster it serves (as the
    plan's spans name it), else its ``--name`` or its kubeconfig's file name."""
    serves: ClusterRef | None = args.cluster
    return serves.name if serves else args.name or args.kubeconfig.stem


async def serve(args: argparse.Namespace, lifecycle: Lifecycle,
                pools: list[tuple[str, FakeNodePoolSpec]], *, tracer: trace.Tracer) -> None:
    settings = EngineSettings(concurrency=args.concurrency, pod_concurrency=args.concurrency,
                              kubelet_port=None if args.no_metrics else args.kubelet_port,
                              kubelet_tls_port=args.kubelet_tls_port,
                              node_grace=args.node_monitor_grace)
    member = load_kubeconfig_file(args.kubeconfig)
    # Requests in flight plus the long watches (nodes, pods) and the events.
    # Writes go through SlowWrites, which an APIServerSlow fault on the FakeCluster slows.
    slowed = [SlowWrites(AiohttpTransport(member, connections=connections))
              for connections in (settings.pod_concurrency + 4,
                                  settings.heartbeat_connections)]
    client, heartbeats = (Client(transport, server=member.server) for transport in slowed)

    def slow_down(seconds: float) -> None:
        if seconds != slowed[0].delay:
            logger.info("engine: every write now waits %.3fs first (APIServerSlow)", seconds)
        for transport in slowed:
            transport.delay = seconds
    host_config = host_of(args)
    host = Client.connect(host_config.load(), connections=4) if host_config else None
    serves: ClusterRef | None = args.cluster
    name = f"{serves.namespace}.{serves.name}" if serves else args.name or args.kubeconfig.stem
    engine = ClusterEngine(name, client, heartbeat_client=heartbeats, host=host, serves=serves,
                           pools=dict(pools) if not serves else None, settings=settings,
                           rules=compile_lifecycle(lifecycle), on_latency=slow_down,
                           tracer=tracer, kubelet_pki=args.kubelet_pki,
                           scripts=Scripts(lifecycle))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    logger.info("engine %s: starting (%s)", name,
                f"pools of FakeCluster {serves.namespace}/{serves.name}" if serves else
                ", ".join(f"{pool}={spec.replicas}" for pool, spec in pools) or "no pools")
    task = asyncio.create_task(engine.run())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await engine.close()
        if host is not None:
            await host.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operators.engine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", type=Path, required=True,
                        help="the member cluster whose nodes and pods to simulate")
    parser.add_argument("--host-kubeconfig", type=Path, default=None,
                        help="the host cluster that holds the FakeNodePools (with --cluster)")
    parser.add_argument("--host-in-cluster", action="store_true",
                        help="the host cluster is the pod's own, reached with its service "
                             "account (instead of --host-kubeconfig)")
    parser.add_argument("--service-account-dir", type=Path, default=SERVICE_ACCOUNT_DIR,
                        help=f"with --host-in-cluster: the token, ca.crt and namespace "
                             f"(default {SERVICE_ACCOUNT_DIR})")
    parser.add_argument("--cluster", type=parse_cluster, default=None,
                        metavar="NAMESPACE/NAME", help="serve the pools of this FakeCluster")
    parser.add_argument("--name", default="",
                        help="the engine's name in node providerIDs (alone; default: the "
                             "kubeconfig's file name)")
    parser.add_argument("--pool", action="append", default=[],
                        metavar="NAME=REPLICAS[:GPU[:ALLOCATION]]")
    parser.add_argument("--stages", type=Path, default=None,
                        help="a kind: Lifecycle YAML file replacing the default stages")
    parser.add_argument("--grace-cap", default="1s",
                        help="longest a deleted pod waits before it is finalised")
    parser.add_argument("--concurrency", type=integer(1, 1024), default=64,
                        help="requests in flight at once (one connection each), from 1 to "
                             "1024")
    parser.add_argument("--kubelet-port", type=integer(0, 65535, "a port"), default=0,
                        metavar="PORT",
                        help="port of the nodes' kubelet endpoints and of the DCGM endpoint, "
                             "0 for a free one (default)")
    parser.add_argument("--kubelet-tls-port", type=integer(0, 65535, "a port"), default=0,
                        metavar="PORT",
                        help="with --kubelet-pki: port of the nodes' kubelet API over TLS, "
                             "which they advertise; 0 for a free one (default)")
    parser.add_argument("--kubelet-pki", type=lambda text: KubeletPKI(Path(text)), default=None,
                        metavar="DIR",
                        help="the member's kubelet PKI (ca.crt and ca.key of the CA its API "
                             "server's --kubelet-certificate-authority names): serve the "
                             "kubelet API (logs, exec, attach, port-forward) over TLS with "
                             "node certificates it issues")
    parser.add_argument("--node-monitor-grace", type=number(1, 3600, "a number of seconds"),
                        default=NODE_GRACE, metavar="SECONDS",
                        help="the member's node-lifecycle controller's grace period (the "
                             "operator gives the FakeCluster's "
                             "spec.controlPlane.nodeMonitorGracePeriod): Lease renewals go out "
                             "at most every fifth of it, and a renewal gap past 3/4 of it puts "
                             "a pool's heartbeats at risk; from 1 to 3600 "
                             f"(default {NODE_GRACE:.0f})")
    parser.add_argument("--no-metrics", action="store_true",
                        help="measure no usage and serve no kubelet or DCGM endpoint")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.host_kubeconfig is not None and args.host_in_cluster:
        parser.error("--host-kubeconfig and --host-in-cluster are two ways to one host: "
                     "give one")
    if (args.cluster is None) != (host_of(args) is None):
        parser.error("--cluster and --host-kubeconfig (or --host-in-cluster) go together")
    if args.cluster is not None and args.pool:
        parser.error("--pool is for an engine without a host cluster; its pools come from "
                     "the FakeNodePools of --cluster")
    try:
        pools = [parse_pool(text, args.grace_cap) for text in args.pool]
        lifecycle = default_lifecycle() if args.stages is None else load_lifecycle(
            args.stages.read_text(), source=str(args.stages))
    except (argparse.ArgumentTypeError, ValueError, OSError) as error:
        parser.error(str(error))
    if args.kubelet_pki is not None:
        try:
            load_authority(args.kubelet_pki)
        except (ValueError, OSError, StateError) as error:
            parser.error(f"--kubelet-pki {args.kubelet_pki.directory}: cannot read its CA: "
                         f"{error}")
    if not args.no_metrics:
        raise_open_files()
    provider = setup.configure("fakefleet-engine", cluster=cluster_name(args))
    try:
        asyncio.run(serve(args, lifecycle, pools,
                          tracer=provider.get_tracer("operators.engine")))
    except (K8sError, StageError, ServingError) as error:
        logger.error("%s", error)
        return 1
    finally:
        setup.shutdown()  # the last batches' spans leave before the process does
    return 0


if __name__ == "__main__":
    sys.exit(main())
