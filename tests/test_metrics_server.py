"""The metrics-server add-on's pure parts: its build (over a fake ``go``), the manifests read from
a module tree, the rendering for loopback, the aggregation layer's flags, the planner and its
MetricsServerReady condition, and what the FakeCluster spec and status say of it."""

from __future__ import annotations

import base64
import os
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.addons.lifecycle import Build, Hook, Start, Stop
from operators.addons.metricsserver import TOOL, planning, rendering, source
from operators.addons.metricsserver.planning import Observed
from operators.api.clusters import METRICS_SERVER_LOCAL_RULE, FakeCluster
from operators.controlplane import state as state_module
from operators.controlplane.errors import BinaryError
from operators.controlplane.state import EngineEndpoint, StateDir, publish
from operators.handlers import runtime as runtime_module
from operators.k8s.config import HostConfig
from operators.reconciling import clusters as cluster_planning
from operators.reconciling.clusters import AddonState

CA = b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"
NOW = "2026-12-01T09:00:00Z"


def cluster(**spec: Any) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": "west", "namespace": "default", "generation": 1, "uid": "u"},
        "spec": spec})


# -- the spec -----------------------------------------------------------------------------------

def test_metrics_server_is_on_by_default_for_a_local_control_plane_only() -> None:
    default = cluster().spec.metrics_server
    assert default is not None
    assert default.resolution == "15s"
    assert cluster(addons={"metricsServer": {"resolution": "30s"}}).spec.metrics_server \
        is not None
    assert cluster(addons={"metricsServer": {"enabled": False}}).spec.metrics_server is None
    external = cluster(controlPlane={"backend": "external",
                                     "kubeconfigSecretRef": {"name": "s"}})
    assert external.spec.metrics_server is None
    assert "backend 'local'" in METRICS_SERVER_LOCAL_RULE["message"]


def test_the_resolution_is_checked_by_the_api_server_with_a_message() -> None:
    schema = FakeCluster.model_json_schema()["$defs"]["MetricsServerSpec"]["properties"]
    (check,) = schema["resolution"]["x-kubernetes-validations"]
    assert check["rule"] == "duration(self) >= duration('10s')"
    assert "give a resolution of 10s or more" in check["message"]


# -- building -----------------------------------------------------------------------------------

def fake_go(directory: Path, script: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    go.chmod(go.stat().st_mode | stat.S_IEXEC)


def test_build_installs_the_metrics_server_command_into_its_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache machinery is GoTool's (tests/test_compiling.py); here, metrics-server's
    package and place in the cache."""
    fake_go(tmp_path / "bin", """
        echo "$@" > "$GOBIN/../argv"
        printf '#!/bin/sh\\n' > "$GOBIN/metrics-server"; chmod +x "$GOBIN/metrics-server"
    """)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv(TOOL.override, raising=False)
    said: list[str] = []
    path = TOOL.ensure(root=tmp_path / "cache", progress=said.append)
    assert path == tmp_path / "cache" / "metrics-server" / "v0.8.0" / "metrics-server"
    assert (path.parent / "argv").read_text().split()[-1] == \
        "sigs.k8s.io/metrics-server/cmd/metrics-server@v0.8.0"
    assert said[0] == "building metrics-server v0.8.0 with go install (from the Go module proxy)"
    assert TOOL.find(root=tmp_path / "cache") == path


def test_override_must_be_an_executable(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOOL.override, str(tmp_path / "missing"))
    with pytest.raises(BinaryError, match=r"FAKEFLEET_METRICS_SERVER=.* does not name"):
        TOOL.find()


# -- rendering ----------------------------------------------------------------------------------

def module_tree(root: Path) -> Path:
    base = root / "manifests" / "base"
    base.mkdir(parents=True)
    (base / "rbac.yaml").write_text(yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "metrics-server", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:metrics-server"}, "rules": []},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:metrics-server"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:metrics-server"},
         "subjects": [{"kind": "ServiceAccount", "name": "metrics-server",
                       "namespace": "kube-system"}]},
    ]))
    (base / "apiservice.yaml").write_text(yaml.safe_dump({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "spec": {"service": {"name": "metrics-server", "namespace": "kube-system"},
                 "group": "metrics.k8s.io", "version": "v1beta1",
                 "insecureSkipTLSVerify": True, "groupPriorityMinimum": 100,
                 "versionPriority": 100}}))
    return root


def test_upstream_rbac_is_bound_to_metrics_server_s_user(tmp_path: Path) -> None:
    objects = rendering.rbac(source.load(module_tree(tmp_path)))
    assert [o["kind"] for o in objects] == ["ClusterRole", "ClusterRoleBinding"]
    assert objects[1]["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                       "name": "fakefleet:metrics-server"}]


def test_the_apiservice_reaches_loopback_through_an_externalname_service(
        tmp_path: Path) -> None:
    manifests = source.load(module_tree(tmp_path))
    apiservice = rendering.apiservice(manifests, port=9444, ca_pem=CA)
    assert apiservice["spec"]["service"] == {"name": "metrics-server",
                                             "namespace": "kube-system", "port": 9444}
    assert apiservice["spec"]["caBundle"] == base64.b64encode(CA).decode()
    assert "insecureSkipTLSVerify" not in apiservice["spec"]
    assert manifests.apiservice["spec"]["insecureSkipTLSVerify"], "upstream's left as it was"
    service = rendering.service(9444)
    assert service["spec"]["type"] == "ExternalName"
    assert service["spec"]["externalName"] == "localhost"
    assert rendering.SERVICE_HOST == "metrics-server.kube-system.svc", \
        "the name the aggregator verifies the serving certificate for"


def test_metrics_server_scrapes_the_engine_s_nodes_at_their_addresses() -> None:
    """At the engine's plain port: the port the nodes advertise is the kubelet API over TLS."""
    argv = rendering.argv(Path("/c/metrics-server"), kubeconfig=Path("/s/kubeconfig"), port=9444,
                          cert=Path("/s/tls.crt"), key=Path("/s/tls.key"), resolution="10s",
                          kubelet_port=41000)
    assert argv[0] == "/c/metrics-server"
    assert "--kubelet-use-node-status-port" not in argv
    for flag in ("--bind-address=127.0.0.1", "--secure-port=9444", "--metric-resolution=10s",
                 "--kubelet-preferred-address-types=InternalIP",
                 "--kubelet-port=41000", "--deprecated-kubelet-completely-insecure",
                 "--node-selector=fakefleet.dev/pool", "--kubelet-request-timeout=5s",
                 "--authentication-kubeconfig=/s/kubeconfig"):
        assert flag in argv


# -- planning -----------------------------------------------------------------------------------

UP = Observed(control_plane_running=True, binary=True)
RUNNING = Observed(control_plane_running=True, binary=True, installed=True, supervised=True,
                   live=True, ready=True, hooked=True, port=9444, resolution="15s")


def test_missing_binary_is_built_in_the_background_and_said() -> None:
    assert planning.plan(cluster(), Observed(control_plane_running=True)) == [
        Build()]
    building_ = Observed(control_plane_running=True, building_for=30.0)
    assert planning.plan(cluster(), building_) == []
    state = planning.condition(cluster(), building_)
    assert state is not None
    assert (state.ready, state.reason) == (False, "Building")
    assert "(30s so far)" in state.message


def test_starts_then_hooks_once_it_answers_then_runs() -> None:
    assert planning.plan(cluster(), UP) == [Start()]
    started = Observed(**{**UP.__dict__, "supervised": True, "resolution": "15s"})
    assert planning.plan(cluster(), started) == [], "no APIService before it answers"
    live = Observed(**{**started.__dict__, "live": True})
    assert planning.plan(cluster(), live) == [Hook()]
    assert planning.plan(cluster(), RUNNING) == []
    state = planning.condition(cluster(), RUNNING)
    assert state == AddonState(
        True, "Running", "metrics-server v0.8.0 serving metrics.k8s.io (kubectl top, HPAs) at "
                         "https://127.0.0.1:9444, scraping every 15s")
    unscraped = planning.condition(cluster(), Observed(**{**RUNNING.__dict__, "ready": False}))
    assert unscraped is not None
    assert "no metrics yet" in unscraped.message


def test_a_new_resolution_restarts_it_and_disabling_it_removes_its_apiservice() -> None:
    slower = cluster(addons={"metricsServer": {"resolution": "30s"}})
    assert planning.plan(slower, RUNNING) == [Stop(unhook=False),
                                              Start()]
    off = cluster(addons={"metricsServer": {"enabled": False}})
    assert planning.plan(off, RUNNING) == [Stop()]
    assert planning.plan(off, Observed()) == []
    assert planning.condition(off, RUNNING) is None


def test_a_crash_is_reported_with_its_log() -> None:
    crashed = Observed(**{**UP.__dict__, "supervised": True, "restarts": 3,
                          "log_tail": "E1201 unable to load configmap\npanic: no client\n"})
    state = planning.condition(cluster(), crashed)
    assert state is not None
    assert state.reason == "Crashed"
    assert state.message.endswith("restarted 3 times: panic: no client")


def test_the_cluster_status_names_its_dcgm_endpoint_and_metrics_server() -> None:
    observed = cluster_planning.Observed(
        control_plane_running=True, secret_current=True, engine_running=True,
        endpoint="https://127.0.0.1:1", dcgm_endpoint="http://127.0.0.1:41000/metrics",
        addons=((planning.CONDITION, AddonState(False, "Starting", "starting metrics-server")),))
    status = cluster_planning.status(cluster(), observed, now=NOW, previous=None)
    assert status.phase == "Ready", "kubectl top waits for scrapes; nothing else does"
    assert status.dcgmEndpoint == "http://127.0.0.1:41000/metrics"
    conditions = {c.type: c for c in status.conditions}
    assert conditions["MetricsServerReady"].reason == "Starting"


def test_an_engine_s_port_is_chosen_once_and_never_another_member_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = StateDir(tmp_path)
    (state.cluster("default.east")).mkdir(parents=True)
    publish(state.engine_file("default.east"), EngineEndpoint(kubeletPort=41001,
                                                              kubeletTlsPort=41003))
    offered = iter([41001, 41002, 41003, 41004])
    monkeypatch.setattr(state_module, "free_port", lambda: next(offered))
    runtime = runtime_module.Runtime(state_dir=tmp_path, host=None,  # type: ignore[arg-type]
                                     host_config=HostConfig(kubeconfig=tmp_path / "k"),
                                     substrate=None,  # type: ignore[arg-type]
                                     resolve_binaries=lambda version: None)  # type: ignore
    assert runtime.engine_endpoint("default.west") is None
    chosen = runtime.engine_endpoint("default.west", choose=True)
    assert chosen == EngineEndpoint(kubeletPort=41002, kubeletTlsPort=41004)
    assert runtime.engine_endpoint("default.west", choose=True) == chosen, "kept"
    assert chosen.dcgm_url == "http://127.0.0.1:41002/metrics"


def test_an_engine_s_tls_port_is_added_to_what_an_older_operator_chose(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain port stays (metrics-server and the nodes' old endpoint used it); the TLS
    port is chosen once and written down."""
    state = StateDir(tmp_path)
    state.cluster("default.west").mkdir(parents=True)
    state.engine_file("default.west").write_text('{"kubeletPort": 41001}')
    assert state_module.read_engine_endpoint(state, "default.west") == EngineEndpoint(
        kubeletPort=41001)
    offered = iter([41001, 41005])
    monkeypatch.setattr(state_module, "free_port", lambda: next(offered))
    chosen = state_module.choose_engine_endpoint(state, "default.west")
    assert chosen == EngineEndpoint(kubeletPort=41001, kubeletTlsPort=41005)
    assert state_module.read_engine_endpoint(state, "default.west") == chosen
