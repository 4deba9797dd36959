"""Command lines of etcd and the Kubernetes components: pure data, no processes started here.

Everything listens on 127.0.0.1 only, and etcd speaks TLS alone, to clients and its peer, with
client certificates required from its own CA. The ``load`` profile lifts request limits the way
KWOK's ``--disable-qps-limits`` does: the apiserver's in-flight limits and API Priority and
Fairness are off, and the scheduler and controller-manager may send thousands of requests per
second.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

from operators.controlplane.pki import SERVICE_CLUSTER_IP_RANGE, ClusterPKI, EtcdPKI


class Profile(enum.StrEnum):
    """How a control plane is tuned."""

    DEFAULT = "default"
    LOAD = "load"


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


def etcd_argv(binary: Path, data_dir: Path, ports: EtcdPorts, pki: EtcdPKI, *,
              fsync: bool) -> list[str]:
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
) -> list[str]:
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
    if profile is Profile.LOAD:
        argv += [
            "--max-requests-inflight=0",
            "--max-mutating-requests-inflight=0",
            "--enable-priority-and-fairness=false",
        ]
    return argv


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
    binary: Path, *, kubeconfig: Path, port: int, pki: ClusterPKI, profile: Profile
) -> list[str]:
    return [
        str(binary),
        *_component_common(kubeconfig, port, profile),
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.service_account_key}",
        "--use-service-account-credentials=true",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--controllers=*",
    ]
