"""Command lines of the components: loopback only, etcd over TLS with client certificates,
per-cluster prefixes, load profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from operators.controlplane import components
from operators.controlplane.components import ClusterPorts, EtcdPorts, Profile
from operators.controlplane.pki import ClusterPKI, EtcdPKI, FrontProxyPKI, KubeletPKI

PKI = ClusterPKI(Path("/state/clusters/a/pki"))
ETCD_PKI = EtcdPKI(Path("/state/etcd/pki"))
ETCD_PORTS = EtcdPorts(client=2379, peer=2380)


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in argv[1:] if "=" in arg)


def test_apiserver_listens_on_loopback_with_its_own_prefix() -> None:
    flags = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="a", etcd_url="https://127.0.0.1:1", etcd_pki=ETCD_PKI,
        port=6443, pki=PKI, profile=Profile.DEFAULT,
    ))
    assert flags["--bind-address"] == "127.0.0.1"
    assert flags["--secure-port"] == "6443"
    assert flags["--etcd-prefix"] == "/fakefleet/clusters/a"
    assert flags["--authorization-mode"] == "Node,RBAC"
    assert flags["--client-ca-file"].endswith("/a/pki/ca.crt")
    assert "--enable-priority-and-fairness" not in flags


def test_prefixes_differ_per_cluster() -> None:
    assert components.etcd_prefix("a") != components.etcd_prefix("b")


def test_load_profile_lifts_client_limits_and_keeps_the_server_s_priorities() -> None:
    """Issue 24: with APF off, no FlowSchema keeps heartbeats ahead of workload traffic. So APF
    stays on, with the seats measured to keep node-high served (bench/README.md)."""
    api = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="a", etcd_url="https://127.0.0.1:1", etcd_pki=ETCD_PKI,
        port=1, pki=PKI, profile=Profile.LOAD,
    ))
    assert "--enable-priority-and-fairness" not in api, "on, as by default"
    limits = components.LIMITS[Profile.LOAD]
    assert limits is not None
    assert api["--max-requests-inflight"] == str(limits.inflight)
    assert api["--max-mutating-requests-inflight"] == str(limits.mutating)
    assert limits.inflight + limits.mutating >= 400 + 200, "60 + 40 starved node-high"
    scheduler = _flags(components.scheduler_argv(
        Path("kube-scheduler"), kubeconfig=Path("k"), port=2, profile=Profile.LOAD))
    kcm = _flags(components.controller_manager_argv(
        Path("kcm"), kubeconfig=Path("k"), port=3, pki=PKI, profile=Profile.LOAD))
    for flags in (scheduler, kcm):
        assert flags["--kube-api-qps"] == "5000"
        assert flags["--bind-address"] == "127.0.0.1"


def test_etcd_without_fsync_only_when_asked() -> None:
    fast = components.etcd_argv(Path("etcd"), Path("/d"), ETCD_PORTS, ETCD_PKI, fsync=False)
    safe = components.etcd_argv(Path("etcd"), Path("/d"), ETCD_PORTS, ETCD_PKI, fsync=True)
    assert "--unsafe-no-fsync=true" in fast
    assert "--unsafe-no-fsync=true" not in safe


def test_etcd_speaks_tls_only_and_wants_client_certificates_of_its_ca() -> None:
    flags = _flags(components.etcd_argv(Path("etcd"), Path("/d"), ETCD_PORTS, ETCD_PKI,
                                        fsync=True))
    for urls in ("--listen-client-urls", "--advertise-client-urls"):
        assert flags[urls] == "https://127.0.0.1:2379"
    for urls in ("--listen-peer-urls", "--initial-advertise-peer-urls"):
        assert flags[urls] == "https://127.0.0.1:2380"
    assert flags["--initial-cluster"] == "fakefleet=https://127.0.0.1:2380"
    assert flags["--cert-file"] == "/state/etcd/pki/server.crt"
    assert flags["--key-file"] == "/state/etcd/pki/server.key"
    assert flags["--client-cert-auth"] == "true"
    assert flags["--trusted-ca-file"] == "/state/etcd/pki/ca.crt"
    assert flags["--peer-cert-file"] == "/state/etcd/pki/peer.crt"
    assert flags["--peer-key-file"] == "/state/etcd/pki/peer.key"
    assert flags["--peer-client-cert-auth"] == "true"
    assert flags["--peer-trusted-ca-file"] == "/state/etcd/pki/ca.crt"
    assert not any("http://" in value for value in flags.values())


def test_apiserver_reaches_etcd_with_its_own_client_certificate() -> None:
    flags = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="a", etcd_url=components.etcd_client_url(ETCD_PORTS),
        etcd_pki=ETCD_PKI, port=6443, pki=PKI, profile=Profile.DEFAULT,
    ))
    assert flags["--etcd-servers"] == "https://127.0.0.1:2379"
    assert flags["--etcd-cafile"] == "/state/etcd/pki/ca.crt"
    assert flags["--etcd-certfile"] == "/state/etcd/pki/apiserver-client.crt"
    assert flags["--etcd-keyfile"] == "/state/etcd/pki/apiserver-client.key"


def test_cluster_ports_are_plain_data() -> None:
    ports = ClusterPorts(apiserver=1, scheduler=2, controller_manager=3)
    assert ports.apiserver == 1


def test_member_api_servers_run_the_aggregation_layer(tmp_path: Path) -> None:
    proxy = FrontProxyPKI(tmp_path / "front-proxy")
    argv = components.apiserver_argv(
        Path("kube-apiserver"), cluster="c", etcd_url="https://127.0.0.1:1",
        etcd_pki=EtcdPKI(tmp_path / "etcd"), port=6443, pki=ClusterPKI(tmp_path / "pki"),
        profile=components.Profile.DEFAULT, front_proxy=proxy)
    assert f"--requestheader-client-ca-file={proxy.ca_cert}" in argv
    assert "--requestheader-allowed-names=front-proxy-client" in argv
    assert f"--proxy-client-cert-file={proxy.client_cert}" in argv
    assert "--requestheader-username-headers=X-Remote-User" in argv
    manager = components.controller_manager_argv(
        Path("kcm"), kubeconfig=Path("k"), port=1, pki=ClusterPKI(tmp_path / "pki"),
        profile=components.Profile.DEFAULT)
    assert "--horizontal-pod-autoscaler-sync-period=5s" in manager


def test_member_api_servers_reach_kubelets_at_their_address_verified_with_a_client_cert(
        tmp_path: Path) -> None:
    """The API server's default address order starts with Hostname (a fake node's name
    resolves to nothing); without a CA it would take any kubelet certificate."""
    kubelet = KubeletPKI(tmp_path / "kubelet")
    flags = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="c", etcd_url="https://127.0.0.1:1",
        etcd_pki=ETCD_PKI, port=6443, pki=PKI, profile=Profile.DEFAULT, kubelet=kubelet))
    assert flags["--kubelet-preferred-address-types"] == "InternalIP"
    assert flags["--kubelet-certificate-authority"] == str(kubelet.ca_cert)
    assert flags["--kubelet-client-certificate"] == str(tmp_path / "kubelet/apiserver-client.crt")
    assert flags["--kubelet-client-key"] == str(tmp_path / "kubelet/apiserver-client.key")
    assert not any(flag.startswith("--feature-gates") for flag in flags)


def test_the_health_probe_context_verifies_nothing_and_loads_no_ca() -> None:
    from operators.controlplane.health import insecure_tls

    context = insecure_tls()
    assert context.verify_mode.name == "CERT_NONE"
    assert not context.check_hostname
    assert context.get_ca_certs() == []


def test_request_limits_are_data_a_benchmark_may_change() -> None:
    tried = components.RequestLimits(inflight=20, mutating=10)
    api = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="a", etcd_url="https://127.0.0.1:1", etcd_pki=ETCD_PKI,
        port=1, pki=PKI, profile=Profile.LOAD, limits=tried))
    assert (api["--max-requests-inflight"], api["--max-mutating-requests-inflight"]) == (
        "20", "10")
    default = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="a", etcd_url="https://127.0.0.1:1", etcd_pki=ETCD_PKI,
        port=1, pki=PKI, profile=Profile.DEFAULT))
    assert "--max-requests-inflight" not in default, "upstream's defaults"
    with pytest.raises(ValueError, match="mutating 0 serves nothing"):
        components.RequestLimits(inflight=1, mutating=0)


def test_the_node_monitor_grace_period_is_given_only_when_set() -> None:
    default = _flags(components.controller_manager_argv(
        Path("kcm"), kubeconfig=Path("k"), port=3, pki=PKI, profile=Profile.DEFAULT))
    assert "--node-monitor-grace-period" not in default, "the controller-manager's own 50 s"
    short = _flags(components.controller_manager_argv(
        Path("kcm"), kubeconfig=Path("k"), port=3, pki=PKI, profile=Profile.DEFAULT,
        node_monitor_grace=20.0))
    assert short["--node-monitor-grace-period"] == "20s"
    odd = _flags(components.controller_manager_argv(
        Path("kcm"), kubeconfig=Path("k"), port=3, pki=PKI, profile=Profile.LOAD,
        node_monitor_grace=90.5))
    assert odd["--node-monitor-grace-period"] == "90.5s"
