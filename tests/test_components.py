"""Command lines of the components: loopback only, per-cluster prefixes, load profile."""

from __future__ import annotations

from pathlib import Path

from operators.controlplane import components
from operators.controlplane.components import ClusterPorts, EtcdPorts, Profile
from operators.controlplane.pki import ClusterPKI

PKI = ClusterPKI(Path("/state/clusters/a/pki"))


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in argv[1:] if "=" in arg)


def test_apiserver_listens_on_loopback_with_its_own_prefix() -> None:
    flags = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="a", etcd_url="http://127.0.0.1:1", port=6443,
        pki=PKI, profile=Profile.DEFAULT,
    ))
    assert flags["--bind-address"] == "127.0.0.1"
    assert flags["--secure-port"] == "6443"
    assert flags["--etcd-prefix"] == "/fakefleet/clusters/a"
    assert flags["--authorization-mode"] == "Node,RBAC"
    assert flags["--client-ca-file"].endswith("/a/pki/ca.crt")
    assert "--enable-priority-and-fairness" not in flags


def test_prefixes_differ_per_cluster() -> None:
    assert components.etcd_prefix("a") != components.etcd_prefix("b")


def test_load_profile_lifts_limits_everywhere() -> None:
    api = _flags(components.apiserver_argv(
        Path("kube-apiserver"), cluster="a", etcd_url="http://127.0.0.1:1", port=1,
        pki=PKI, profile=Profile.LOAD,
    ))
    assert api["--max-requests-inflight"] == "0"
    assert api["--max-mutating-requests-inflight"] == "0"
    assert api["--enable-priority-and-fairness"] == "false"
    scheduler = _flags(components.scheduler_argv(
        Path("kube-scheduler"), kubeconfig=Path("k"), port=2, profile=Profile.LOAD))
    kcm = _flags(components.controller_manager_argv(
        Path("kcm"), kubeconfig=Path("k"), port=3, pki=PKI, profile=Profile.LOAD))
    for flags in (scheduler, kcm):
        assert flags["--kube-api-qps"] == "5000"
        assert flags["--bind-address"] == "127.0.0.1"


def test_etcd_without_fsync_only_when_asked() -> None:
    ports = EtcdPorts(client=2379, peer=2380)
    fast = components.etcd_argv(Path("etcd"), Path("/d"), ports, fsync=False)
    safe = components.etcd_argv(Path("etcd"), Path("/d"), ports, fsync=True)
    assert "--unsafe-no-fsync=true" in fast
    assert "--unsafe-no-fsync=true" not in safe
    assert _flags(safe)["--listen-client-urls"] == "http://127.0.0.1:2379"


def test_cluster_ports_are_plain_data() -> None:
    ports = ClusterPorts(apiserver=1, scheduler=2, controller_manager=3)
    assert ports.apiserver == 1
