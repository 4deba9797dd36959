"""Command lines of etcd and the Kubernetes components: pure data, no processes started here.

Everything listens on 127.0.0.1 only, and etcd speaks TLS alone, to clients and its peer, with
client certificates required from its own CA. API Priority and Fairness is on in every profile,
as in real clusters: it is what keeps heartbeats ahead of workload traffic (the engine is in
``system:nodes``, whose Lease and node writes upstream's FlowSchema ``system-node-high`` puts at
``node-high``). The ``load`` profile lets the scheduler and controller-manager send thousands of
requests per second, and gives the API server in-flight limits low enough that APF actually
queues on two cores (:data:`LIMITS`: data, so that a benchmark can try others); admins
(``system:masters``: kubectl, the benchmarks' harness) are exempt from APF whatever the limits.
Every member's API server runs the aggregation layer (front-proxy PKI, requestheader flags),
so an APIService such as metrics-server's ``v1beta1.metrics.k8s.io`` can be served, and reaches
its kubelets (the engine: ``kubectl logs``) as a real cluster's does, over TLS with a client
certificate, verifying theirs (:func:`kubelet_argv`).

Tracing: when spans are exported (``OTEL_EXPORTER_OTLP_ENDPOINT``, the embedded collector's
under ``fakefleet up``), the kube-apiservers get ``--tracing-config-file`` and etcd its
``--enable-distributed-tracing`` flags, both with a sampling rate of 0: their samplers are
``ParentBased(NeverSample)`` (k8s.io/component-base/tracing and etcd's embed at the pinned
versions), so they trace exactly the requests whose incoming ``traceparent`` is sampled (a
fault's writes, made in the engine's spans) and nothing else. Both exporters speak plaintext
OTLP/gRPC to ``host:port`` and cannot use TLS; they report the services ``apiserver`` and
``etcd``. The kube-apiserver honours an incoming ``traceparent`` only from a client in
``system:masters`` (or ``system:monitoring``); from any other client it starts a new,
unsampled trace linked to it (otelhttp's public-endpoint rule in its WithTracing filter).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from federation.telemetry.exporting import exporting
from operators.controlplane.pki import (
    FRONT_PROXY_CLIENT,
    SERVICE_CLUSTER_IP_RANGE,
    ClusterPKI,
    EtcdPKI,
    FrontProxyPKI,
    KubeletPKI,
)

logger = logging.getLogger(__name__)

#: The port of an OTLP/gRPC endpoint named without one.
OTLP_GRPC_PORT = 4317
#: The TracingConfiguration's version at the pinned Kubernetes (GA since 1.34).
TRACING_API_VERSION = "apiserver.config.k8s.io/v1"
#: How often HorizontalPodAutoscalers are evaluated (upstream: 15s): a simulation's usage
#: changes are seen within a few seconds, at the price of a few cheap reads per HPA.
HPA_SYNC_PERIOD = "5s"


class Profile(enum.StrEnum):
    """How a control plane is tuned."""

    DEFAULT = "default"
    LOAD = "load"


@dataclasses.dataclass(frozen=True)
class RequestLimits:
    """How many requests the API server serves at once (``--max-requests-inflight``,
    ``--max-mutating-requests-inflight``). With APF on, their sum is the seats its priority
    levels share (node-high's nominal share is 40 of 245); past their share, a level's requests
    queue, and a level with room (node-high, for heartbeats) goes on being served."""

    inflight: int
    mutating: int

    def __post_init__(self) -> None:
        for name in ("inflight", "mutating"):
            if getattr(self, name) < 1:
                raise ValueError(f"request limits: {name} {getattr(self, name)} serves "
                                 f"nothing; give at least 1 (or the API server's defaults, "
                                 f"400 and 200)")


#: The API server's request limits per profile (None: its own defaults). Measured at 5000 nodes
#: and 10000 pods on two cores (bench/README.md, 2026-12-03): with 60 + 40 seats node-high got
#: about 17, Lease renewals waited 0.8-1.8 s in its queues on average, hundreds were answered
#: 429, and 70-754 nodes went NotReady per phase; with 400 + 200 APF still queues where it
#: matters (in the scheduled phase node-high waited 0.78 s on average and the scheduler's and
#: controllers' requests at workload-high were the ones answered 429) and no node went
#: NotReady. The load profile says so explicitly rather than leaving it to upstream's defaults.
LIMITS: dict[Profile, RequestLimits | None] = {
    Profile.DEFAULT: None,
    Profile.LOAD: RequestLimits(inflight=400, mutating=200),
}


@dataclasses.dataclass(frozen=True)
class EtcdPorts:
    client: int
    peer: int


@dataclasses.dataclass(frozen=True)
class ClusterPorts:
    """Loopback ports of one cluster; kept in its state so endpoints survive restarts."""

    apiserver: int
    scheduler: int
    controller_manager: int


#: Where a cluster's keys live in the shared etcd; unique per cluster.
def etcd_prefix(cluster: str) -> str:
    return f"/fakefleet/clusters/{cluster}"


def etcd_client_url(ports: EtcdPorts) -> str:
    return f"https://127.0.0.1:{ports.client}"


def tracing_endpoint(environ: Mapping[str, str]) -> str | None:
    """``host:port`` of the OTLP/gRPC endpoint that ``environ`` exports spans to (its traces
    endpoint first), for the control plane's own exporters; None when spans are not exported,
    or go to an ``https`` endpoint (the apiserver's and etcd's exporters speak plaintext
    only: they would fail on every export, so they do not trace)."""
    if not exporting(environ):
        return None
    value = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
        environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    parsed = urllib.parse.urlsplit(value if "//" in value else f"//{value}")
    if parsed.scheme == "https":
        logger.warning("the kube-apiservers and etcd do not send spans to %s: their exporters "
                       "cannot use TLS (give a plaintext http:// endpoint to trace them)",
                       value)
        return None
    if not parsed.hostname:
        return None
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"{host}:{parsed.port or OTLP_GRPC_PORT}"


def tracing_configuration(endpoint: str) -> str:
    """The kube-apiserver's ``--tracing-config-file``: spans to ``endpoint`` (host:port), and
    only those of requests whose incoming trace context is sampled."""
    return (f"apiVersion: {TRACING_API_VERSION}\n"
            "kind: TracingConfiguration\n"
            f"endpoint: {endpoint}\n"
            "samplingRatePerMillion: 0\n")


def etcd_tracing_argv(endpoint: str) -> list[str]:
    """etcd's tracing flags (etcd 3.6; the ``--experimental-`` spellings go in 3.7): spans
    of the apiservers' sampled requests to ``endpoint``, none of its own."""
    return [
        "--enable-distributed-tracing=true",
        f"--distributed-tracing-address={endpoint}",
        "--distributed-tracing-service-name=etcd",
        "--distributed-tracing-instance-id=fakefleet-etcd",
        "--distributed-tracing-sampling-rate=0",
    ]


def etcd_argv(binary: Path, data_dir: Path, ports: EtcdPorts, pki: EtcdPKI, *,
              fsync: bool, tracing: str | None = None) -> list[str]:
    """``tracing``: the OTLP endpoint (host:port) etcd sends spans to (None: no tracing)."""
    peer = f"https://127.0.0.1:{ports.peer}"
    client = etcd_client_url(ports)
    argv = [
        str(binary),
        "--name=fakefleet",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--cert-file={pki.serving_cert}",
        f"--key-file={pki.serving_key}",
        "--client-cert-auth=true",
        f"--trusted-ca-file={pki.ca_cert}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=fakefleet={peer}",
        f"--peer-cert-file={pki.peer_cert}",
        f"--peer-key-file={pki.peer_key}",
        "--peer-client-cert-auth=true",
        f"--peer-trusted-ca-file={pki.ca_cert}",
        "--quota-backend-bytes=8589934592",
        "--auto-compaction-retention=5m",
        "--log-level=warn",
    ]
    if not fsync:
        argv.append("--unsafe-no-fsync=true")
    if tracing:
        argv += etcd_tracing_argv(tracing)
    return argv


def apiserver_argv(
    binary: Path,
    *,
    cluster: str,
    etcd_url: str,
    etcd_pki: EtcdPKI,
    port: int,
    pki: ClusterPKI,
    profile: Profile,
    tracing_config: Path | None = None,
    front_proxy: FrontProxyPKI | None = None,
    kubelet: KubeletPKI | None = None,
    limits: RequestLimits | None = None,
) -> list[str]:
    """``tracing_config``: a file of :func:`tracing_configuration` (None: no tracing);
    ``front_proxy``: the aggregation layer's PKI (None: no aggregated API servers);
    ``kubelet``: the kubelets' PKI (None: the API server's defaults, which cannot reach the
    engine's kubelets); ``limits``: other request limits than the profile's (:data:`LIMITS`)."""
    argv = [
        str(binary),
        f"--etcd-servers={etcd_url}",
        f"--etcd-cafile={etcd_pki.ca_cert}",
        f"--etcd-certfile={etcd_pki.apiserver_client_cert}",
        f"--etcd-keyfile={etcd_pki.apiserver_client_key}",
        f"--etcd-prefix={etcd_prefix(cluster)}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
    ]
    limits = limits or LIMITS[profile]
    if limits is not None:
        argv += [
            f"--max-requests-inflight={limits.inflight}",
            f"--max-mutating-requests-inflight={limits.mutating}",
        ]
    if tracing_config is not None:
        argv.append(f"--tracing-config-file={tracing_config}")
    if front_proxy is not None:
        argv += aggregation_argv(front_proxy)
    if kubelet is not None:
        argv += kubelet_argv(kubelet)
    return argv


def kubelet_argv(pki: KubeletPKI) -> list[str]:
    """How the API server reaches a node's kubelet (logs, exec, port-forward): at its
    InternalIP (the default order starts with Hostname, and a fake node's name resolves to
    nothing), over TLS verified with the kubelets' CA (without it, the API server would accept
    any certificate), presenting the client certificate the engine accepts."""
    return [
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-certificate-authority={pki.ca_cert}",
        f"--kubelet-client-certificate={pki.client_cert}",
        f"--kubelet-client-key={pki.client_key}",
    ]


def aggregation_argv(pki: FrontProxyPKI) -> list[str]:
    """The aggregation layer: the API server proxies an APIService's group (metrics.k8s.io)
    to its server, authenticated by the front-proxy client certificate, and passes on who asked
    in these headers, which the aggregated server trusts from that certificate alone (it reads
    them from kube-system/extension-apiserver-authentication, which the API server fills)."""
    return [
        f"--requestheader-client-ca-file={pki.ca_cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.client_cert}",
        f"--proxy-client-key-file={pki.client_key}",
    ]


def _component_common(kubeconfig: Path, port: int, profile: Profile) -> list[str]:
    argv = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
    ]
    if profile is Profile.LOAD:
        argv += ["--kube-api-qps=5000", "--kube-api-burst=10000"]
    return argv


def scheduler_argv(binary: Path, *, kubeconfig: Path, port: int, profile: Profile) -> list[str]:
    return [str(binary), *_component_common(kubeconfig, port, profile)]


def controller_manager_argv(
    binary: Path, *, kubeconfig: Path, port: int, pki: ClusterPKI, profile: Profile,
    node_monitor_grace: float | None = None,
) -> list[str]:
    """``node_monitor_grace``: the node-lifecycle controller's grace period in seconds (None:
    the controller-manager's default, 50 s)."""
    grace = ([f"--node-monitor-grace-period={node_monitor_grace:g}s"]
             if node_monitor_grace is not None else [])
    return [
        str(binary),
        *_component_common(kubeconfig, port, profile),
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.service_account_key}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--controllers=*",
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
        *grace,
    ]
