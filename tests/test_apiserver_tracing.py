"""The control plane's own spans: where etcd and the kube-apiservers send them (the OTLP
endpoint of the environment, as host:port), the TracingConfiguration file the apiservers get
(sampling only what arrives sampled), and no flag at all when spans are not exported."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from operators.controlplane import components
from operators.controlplane.binaries import Binaries
from operators.controlplane.components import EtcdPorts, Profile
from operators.controlplane.pki import ClusterPKI, EtcdPKI
from operators.controlplane.state import StateDir
from operators.controlplane.substrate import Substrate

PKI = ClusterPKI(Path("/state/clusters/a/pki"))
ETCD_PKI = EtcdPKI(Path("/state/etcd/pki"))
COLLECTOR = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
             "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
BINARIES = Binaries("v1.36.3", Path("etcd"), Path("kube-apiserver"), Path("kube-scheduler"),
                    Path("kube-controller-manager"))


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.split("=", 1) for arg in argv[1:] if "=" in arg)


@pytest.mark.parametrize(("environ", "endpoint"), [
    (COLLECTOR, "127.0.0.1:4317"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost"}, "localhost:4317"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317"}, "collector:4317"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://[::1]:4317"}, "[::1]:4317"),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1",
      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:2"}, "b:2"),
    ({}, None),
    ({**COLLECTOR, "OTEL_SDK_DISABLED": "true"}, None),
    ({**COLLECTOR, "OTEL_TRACES_EXPORTER": "none"}, None),
])
def test_the_endpoint_is_host_and_port_of_the_exported_one(
        environ: dict[str, str], endpoint: str | None) -> None:
    assert components.tracing_endpoint(environ) == endpoint


def test_a_tls_endpoint_is_not_given_to_exporters_that_cannot_speak_tls(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert components.tracing_endpoint(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://tempo.example:4317"}) is None
    assert "cannot use TLS" in caplog.text


def test_the_tracing_configuration_samples_only_what_arrives_sampled() -> None:
    assert yaml.safe_load(components.tracing_configuration("127.0.0.1:4317")) == {
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "TracingConfiguration",
        "endpoint": "127.0.0.1:4317", "samplingRatePerMillion": 0}


def test_the_apiserver_gets_the_tracing_flag_only_with_a_file() -> None:
    common = {"cluster": "a", "etcd_url": "https://127.0.0.1:1", "etcd_pki": ETCD_PKI,
              "port": 6443, "pki": PKI, "profile": Profile.DEFAULT}
    traced = _flags(components.apiserver_argv(
        Path("kube-apiserver"), tracing_config=Path("/state/clusters/a/tracing.yaml"),
        **common))  # type: ignore[arg-type]
    untraced = components.apiserver_argv(Path("kube-apiserver"),
                                         **common)  # type: ignore[arg-type]
    assert traced["--tracing-config-file"] == "/state/clusters/a/tracing.yaml"
    assert not any(arg.startswith("--tracing") for arg in untraced)


def test_etcd_traces_only_what_arrives_sampled_and_only_when_asked() -> None:
    ports = EtcdPorts(client=2379, peer=2380)
    traced = _flags(components.etcd_argv(Path("etcd"), Path("/d"), ports, ETCD_PKI,
                                         fsync=True, tracing="127.0.0.1:4317"))
    untraced = components.etcd_argv(Path("etcd"), Path("/d"), ports, ETCD_PKI, fsync=True)
    assert traced["--enable-distributed-tracing"] == "true"
    assert traced["--distributed-tracing-address"] == "127.0.0.1:4317"
    assert traced["--distributed-tracing-service-name"] == "etcd"
    assert traced["--distributed-tracing-sampling-rate"] == "0"
    assert not any("tracing" in arg for arg in untraced)


def test_the_substrate_writes_the_file_when_spans_are_exported_and_removes_it_when_not(
        tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.cluster("a").mkdir(parents=True)
    traced = Substrate(tmp_path, BINARIES, environ=COLLECTOR)
    assert traced.tracing == "127.0.0.1:4317"
    path = traced._tracing_config(state, "a")
    assert path == state.tracing_config("a")
    assert yaml.safe_load(path.read_text())["endpoint"] == "127.0.0.1:4317"
    assert path.stat().st_mode & 0o077 == 0
    untraced = Substrate(tmp_path, BINARIES, environ={})
    assert untraced._tracing_config(state, "a") is None
    assert not path.exists(), "a file of a traced run is not left for an untraced one"
