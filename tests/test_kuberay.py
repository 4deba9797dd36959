"""The KubeRay add-on's pure parts: its tool (the main package built in a wrapper module with
fakefleet's file), its manifests read from a module tree, what it renders for a member, the
planner and its KubeRayReady condition."""

from __future__ import annotations

import base64
import json
import os
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.addons.kuberay import TOOL, planning, rendering, source
from operators.addons.kuberay.planning import Observed
from operators.addons.lifecycle import Build, Hook, Start, Stop
from operators.api.clusters import FakeCluster
from operators.controlplane import wrapping
from operators.controlplane.tools import GoTool
from operators.reconciling.clusters import AddonState

PORTS = rendering.KubeRayPorts(webhook=19443, health=19082, metrics=19080)
RUNNING = Observed(control_plane_running=True, binary=True, installed=True, supervised=True,
                   ready=True, hooked=True, ports=PORTS)
UPSTREAM_GOMOD = ("module github.com/ray-project/kuberay/ray-operator\n\ngo 1.24.0\n\n"
                  "require (\n\tk8s.io/api v0.34.1\n)\n")


def cluster(**addon: Any) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": "west", "namespace": "default", "generation": 1, "uid": "u"},
        "spec": {"addons": {"kuberay": addon}}})


# -- the tool: upstream's main package with fakefleet's file, in a wrapper module -------------

def test_an_empty_object_turns_it_on_and_enabled_false_off() -> None:
    assert cluster().spec.kuberay is not None
    assert cluster(enabled=False).spec.kuberay is None
    assert FakeCluster.model_validate({"metadata": {"name": "west"}}).spec.kuberay is None


def test_the_cache_entry_is_named_after_the_version_and_fakefleet_s_file(tmp_path: Path) -> None:
    release = TOOL.release()
    assert release.startswith("v1.5.0+")
    assert len(release) == len("v1.5.0+") + 8
    assert TOOL.cache_path(tmp_path) == tmp_path / "kuberay" / release / "kuberay"
    addition = tmp_path / "extra.go"
    addition.write_text("package main\n")
    tool = GoTool(name="t", title="T", package="example.com/t", module="example.com/t",
                  version="v1", override="X", additions=(addition,))
    before = tool.release()
    addition.write_text("package main\n\nfunc init() {}\n")
    assert tool.release() != before  # a change of our file builds it anew


def test_fakefleet_s_file_only_adds_flags_for_the_webhook_server() -> None:
    (addition,) = TOOL.additions
    text = addition.read_text()
    assert text.count("flag.") == 3
    for flag in ("webhook-host", "webhook-port", "webhook-cert-dir"):
        assert f'"{flag}"' in text
    assert "StartedChecker()" in text  # /readyz waits for the webhook server


def fake_go(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    go = bin_dir / "go"
    go.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    go.chmod(go.stat().st_mode | stat.S_IXUSR)


def test_the_build_copies_the_main_package_adds_ours_and_builds_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "mod" / "ray-operator@v1.5.0"
    module.mkdir(parents=True)
    (module / "main.go").write_text("package main\n")
    (module / "main_test.go").write_text("package main\n")
    (module / "go.sum").write_text("k8s.io/api v0.34.1 h1:a=\n")
    (tmp_path / "upstream.mod").write_text(UPSTREAM_GOMOD)
    answer = json.dumps({"Dir": str(module), "GoMod": str(tmp_path / "upstream.mod"),
                         "Sum": "h1:tree=", "GoModSum": "h1:mod="})
    # go mod download answers where the source is; go build records what it was given.
    fake_go(tmp_path / "bin", f"""
        if [ "$1" = mod ]; then echo '{answer}'; exit 0; fi
        mkdir -p {tmp_path}/seen && cp -r . {tmp_path}/seen/ && echo "$@" > {tmp_path}/argv
        while [ "$1" != -o ]; do shift; done
        printf '#!/bin/sh\\n' > "$2"; chmod +x "$2"
    """)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv(TOOL.override, raising=False)
    path = TOOL.ensure(root=tmp_path / "cache")
    assert path == TOOL.cache_path(tmp_path / "cache")
    assert path.is_file()
    seen = tmp_path / "seen"
    assert sorted(p.name for p in seen.iterdir()) == ["fakefleet_webhook.go", "go.mod", "go.sum",
                                                       "main.go"]
    assert (seen / "go.mod").read_text().startswith(f"module {wrapping.WRAPPER_MODULE}\n")
    assert (seen / "go.sum").read_text().endswith(
        "github.com/ray-project/kuberay/ray-operator v1.5.0/go.mod h1:mod=\n")
    argv = (tmp_path / "argv").read_text().split()
    assert argv[:3] == ["build", "-v", "-trimpath"]
    assert argv[-1] == "."


# -- manifests and rendering -------------------------------------------------------------------

def module_tree(root: Path) -> Path:
    """A miniature KubeRay source tree with upstream's layout."""
    crd = root / source.CRD_DIR
    (crd / "bases").mkdir(parents=True)
    for plural in ("rayclusters", "rayjobs"):
        (crd / "bases" / f"ray.io_{plural}.yaml").write_text("---\n" + yaml.safe_dump({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.ray.io"}}))
    (crd / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["bases/ray.io_rayclusters.yaml", "bases/ray.io_rayjobs.yaml"]}))
    role = root / source.ROLE_FILE
    role.parent.mkdir(parents=True)
    role.write_text("---\n" + yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kuberay-operator"},
        "rules": [{"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get"]}]}))
    webhook = root / source.WEBHOOK_DIR
    webhook.mkdir(parents=True)
    (webhook / "kustomization.yaml").write_text(yaml.safe_dump({"namePrefix": "kuberay-"}))
    (webhook / "manifests.yaml").write_text("---\n" + yaml.safe_dump({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [{"name": f"v{kind}.kb.io", "failurePolicy": "Fail",
                      "clientConfig": {"service": {
                          "name": "webhook-service", "namespace": "system",
                          "path": f"/validate-ray-io-v1-{kind}"}}}
                     for kind in ("raycluster", "rayjob")]}))
    return root


def test_manifests_are_read_as_upstream_s_kustomizations_list_them(tmp_path: Path) -> None:
    manifests = source.load(module_tree(tmp_path))
    assert [crd["metadata"]["name"] for crd in manifests.crds] == ["rayclusters.ray.io",
                                                                   "rayjobs.ray.io"]
    assert manifests.role["metadata"]["name"] == "kuberay-operator"
    assert manifests.prefix == "kuberay-"
    assert rendering.crds(manifests) == list(manifests.crds)


def test_only_the_webhook_the_binary_serves_is_pointed_at_loopback(tmp_path: Path) -> None:
    manifests = source.load(module_tree(tmp_path))
    (configuration,) = rendering.webhook_configurations(manifests, port=19443, ca_pem=b"CA")
    assert configuration["metadata"] == {"name": "kuberay-validating-webhook-configuration"}
    (webhook,) = configuration["webhooks"]
    assert webhook["name"] == "vraycluster.kb.io"
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["clientConfig"] == {
        "url": "https://127.0.0.1:19443/validate-ray-io-v1-raycluster",
        "caBundle": base64.b64encode(b"CA").decode()}
    assert rendering.webhook_configuration_names(manifests) == [
        ("validatingwebhookconfigurations", "kuberay-validating-webhook-configuration")]


def test_upstream_s_role_is_bound_to_kuberay_s_own_user(tmp_path: Path) -> None:
    role, binding = rendering.rbac(source.load(module_tree(tmp_path)))
    assert role["kind"] == "ClusterRole"
    assert role["metadata"] == {"name": "kuberay-operator"}
    assert binding["roleRef"]["name"] == "kuberay-operator"
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": "fakefleet:kuberay"}]


def test_every_setting_is_on_the_command_line_bounded_and_on_loopback() -> None:
    argv = rendering.argv(Path("/cache/kuberay"), ports=PORTS, cert_dir=Path("/s/pki"))
    assert argv == [
        "/cache/kuberay", "--metrics-addr=127.0.0.1:19080",
        "--health-probe-bind-address=127.0.0.1:19082", "--enable-leader-election=false",
        "--reconcile-concurrency=1", "--qps=50", "--burst=100", "--log-stdout-encoder=json",
        "--zap-log-level=info", "--webhook-host=127.0.0.1", "--webhook-port=19443",
        "--webhook-cert-dir=/s/pki"]
    assert rendering.environment(kubeconfig=Path("/s/kubeconfig")) == {
        "KUBECONFIG": "/s/kubeconfig", "ENABLE_WEBHOOKS": "true"}


# -- planning -----------------------------------------------------------------------------------

def test_no_addon_no_actions_no_condition() -> None:
    plain = FakeCluster.model_validate({"metadata": {"name": "west"}})
    assert planning.plan(plain, Observed()) == []
    assert planning.condition(plain, Observed()) is None


def test_kuberay_is_built_started_then_hooked_once_its_webhook_serves() -> None:
    wanted = cluster()
    assert planning.plan(wanted, Observed(control_plane_running=True)) == [Build()]
    building = planning.condition(wanted, Observed(control_plane_running=True,
                                                   building_for=300.0))
    assert building is not None
    assert building.reason == "Building"
    assert "KubeRay v1.5.0" in building.message
    assert "4 to 13 minutes" in building.message
    assert planning.plan(wanted, Observed(control_plane_running=True, binary=True)) == [Start()]
    started = Observed(control_plane_running=True, binary=True, supervised=True, ports=PORTS)
    assert planning.plan(wanted, started) == []  # its webhook does not serve yet
    assert planning.plan(wanted, Observed(**{**started.__dict__, "ready": True})) == [Hook()]
    assert planning.plan(wanted, RUNNING) == []


def test_disabled_kuberay_stops_and_its_webhook_goes() -> None:
    assert planning.plan(cluster(enabled=False), RUNNING) == [Stop(unhook=True)]


def test_the_condition_says_where_its_webhook_listens() -> None:
    assert planning.condition(cluster(), RUNNING) == AddonState(True, "Running", (
        "KubeRay v1.5.0 running, webhook at https://127.0.0.1:19443; it makes the pods of "
        "RayClusters, which the engine runs"))
    crashed = Observed(**{**RUNNING.__dict__, "ready": False, "hooked": False, "restarts": 2,
                          "log_tail": '{"level":"error","logger":"setup","msg":"unable to start '
                                      'manager","error":"no such file"}\n'})
    state = planning.condition(cluster(), crashed)
    assert state == AddonState(False, "Crashed", "KubeRay exited and was restarted 2 times: "
                                                 "unable to start manager: no such file")


def test_its_condition_is_not_part_of_ready() -> None:
    assert planning.CONDITION.type == "KubeRayReady"
    assert not planning.CONDITION.required
