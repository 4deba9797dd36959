"""The Kueue add-on's pure parts: its build (over a fake ``go``), manifests read from a module
tree, the rendering for loopback, the planner and its KueueReady condition, the CLI's patch."""

from __future__ import annotations

import base64
import os
import stat
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from operators.addons import lifecycle
from operators.addons.kueue import TOOL, planning, rendering, running, source
from operators.addons.kueue.planning import ApplyMultiKueue, Observed, Worker
from operators.addons.lifecycle import Build, Hook, Start, Stop
from operators.api.clusters import FakeCluster
from operators.cli import kueue as kueue_cli
from operators.controlplane.errors import BinaryError
from operators.k8s.client import Client
from operators.reconciling import clusters as cluster_planning
from operators.reconciling.clusters import AddonState
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

NOW = "2026-12-01T09:00:00Z"
CA = b"-----BEGIN CERTIFICATE-----\nfake\n-----END CERTIFICATE-----\n"


def cluster(name: str = "manager", **spec: Any) -> FakeCluster:
    return FakeCluster.model_validate({
        "metadata": {"name": name, "namespace": "default", "generation": 2, "uid": "u"},
        "spec": spec,
    })


MANAGER = {"addons": {"kueue": {"multiKueue": {"workers": ["a", "b"]}}}}
RUNNING = Observed(control_plane_running=True, binary=True, installed=True, supervised=True,
                   ready=True, hooked=True, webhook_port=9443)


# -- building ----------------------------------------------------------------------------------

def fake_go(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    go = bin_dir / "go"
    go.write_text("#!/bin/sh\n" + textwrap.dedent(script))
    go.chmod(go.stat().st_mode | stat.S_IXUSR)


def test_build_installs_the_kueue_command_into_its_cache(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache machinery is GoTool's (tests/test_compiling.py); here, Kueue's package and
    place in the cache."""
    fake_go(tmp_path / "bin", """
        echo "$@" > "$GOBIN/../argv"
        printf '#!/bin/sh\\n' > "$GOBIN/kueue"; chmod +x "$GOBIN/kueue"
    """)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv(TOOL.override, raising=False)
    path = TOOL.ensure(root=tmp_path / "cache")
    assert path == tmp_path / "cache" / "kueue" / "v0.17.0" / "kueue"
    assert (path.parent / "argv").read_text().split()[-1] == \
        "sigs.k8s.io/kueue/cmd/kueue@v0.17.0"
    assert TOOL.find(root=tmp_path / "cache") == path


def test_override_must_be_an_executable(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOOL.override, str(tmp_path / "missing"))
    with pytest.raises(BinaryError, match=r"FAKEFLEET_KUEUE=.* does not name"):
        TOOL.find()


# -- manifests and rendering -------------------------------------------------------------------

def module_tree(root: Path) -> Path:
    """A miniature Kueue source tree with upstream's layout."""
    crd = root / source.CRD_DIR
    (crd / "bases").mkdir(parents=True)
    (crd / "patches").mkdir()
    for plural in ("workloads", "resourceflavors"):
        (crd / "bases" / f"kueue.x-k8s.io_{plural}.yaml").write_text(yaml.safe_dump({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.kueue.x-k8s.io"}, "spec": {"group": "kueue.x-k8s.io"},
        }))
    (crd / "patches" / "webhook_in_workloads.yaml").write_text(yaml.safe_dump({
        "metadata": {"name": "workloads.kueue.x-k8s.io"}}))
    (crd / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["bases/kueue.x-k8s.io_workloads.yaml",
                      "bases/kueue.x-k8s.io_resourceflavors.yaml"],
        "patches": [{"path": "patches/webhook_in_workloads.yaml"}]}))
    rbac = root / source.RBAC_DIR
    rbac.mkdir(parents=True)
    (rbac / "role.yaml").write_text(yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "manager-role"}, "rules": [{"apiGroups": [""],
                                                         "resources": ["pods"],
                                                         "verbs": ["get"]}]}))
    (rbac / "manager_secrets_role.yaml").write_text(yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "manager-secrets-role", "namespace": "system"}, "rules": []}))
    (rbac / "metrics_auth_role.yaml").write_text(yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "metrics-auth-role"}, "rules": []}))
    webhook = root / source.WEBHOOK_DIR
    webhook.mkdir(parents=True)
    (webhook / "manifests.yaml").write_text(yaml.safe_dump_all([
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "mutating-webhook-configuration"},
         "webhooks": [{"name": "mpod.kb.io", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system", "path": "/mutate--v1-pod"}}}]},
        {"apiVersion": "admissionregistration.k8s.io/v1",
         "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "validating-webhook-configuration"},
         "webhooks": [{"name": "vjob.kb.io", "clientConfig": {"service": {
             "name": "webhook-service", "namespace": "system",
             "path": "/validate-batch-v1-job"}}}]},
    ]))
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                      "operator": "NotIn", "values": ["kube-system"]}]}
    (webhook / "kustomization.yaml").write_text(yaml.safe_dump({"patches": [{
        "patch": yaml.safe_dump({"kind": "MutatingWebhookConfiguration", "webhooks": [
            {"name": "mpod.kb.io", "namespaceSelector": selector}]})}]}))
    return root


def test_manifests_are_read_as_upstream_lays_them_out(tmp_path: Path) -> None:
    manifests = source.load(module_tree(tmp_path))
    assert [c["metadata"]["name"] for c in manifests.crds] == [
        "workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io"]
    assert manifests.converted == {"workloads.kueue.x-k8s.io"}
    assert [r["metadata"]["name"] for r in manifests.roles] == [
        "manager-role", "manager-secrets-role", "metrics-auth-role"]
    assert set(manifests.namespace_selectors) == {"mpod.kb.io"}


def test_webhooks_point_at_loopback_with_the_ca(tmp_path: Path) -> None:
    manifests = source.load(module_tree(tmp_path))
    mutating, validating = rendering.webhook_configurations(manifests, port=9555, ca_pem=CA)
    assert mutating["metadata"] == {"name": "kueue-mutating-webhook-configuration"}
    pod = mutating["webhooks"][0]
    assert pod["clientConfig"] == {"url": "https://127.0.0.1:9555/mutate--v1-pod",
                                   "caBundle": base64.b64encode(CA).decode()}
    assert pod["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system"]
    assert "namespaceSelector" not in validating["webhooks"][0]
    assert rendering.webhook_configuration_names(manifests) == [
        ("mutatingwebhookconfigurations", "kueue-mutating-webhook-configuration"),
        ("validatingwebhookconfigurations", "kueue-validating-webhook-configuration")]
    # Upstream's manifests are left as they were.
    assert "service" in manifests.webhooks[0]["webhooks"][0]["clientConfig"]


def test_converted_crds_call_the_loopback_webhook(tmp_path: Path) -> None:
    workloads, flavors = rendering.crds(source.load(module_tree(tmp_path)), port=9555,
                                        ca_pem=CA)
    assert workloads["spec"]["conversion"]["webhook"]["clientConfig"]["url"] == \
        "https://127.0.0.1:9555/convert"
    assert workloads["spec"]["conversion"]["strategy"] == "Webhook"
    assert "conversion" not in flavors["spec"]


def test_rbac_binds_upstream_roles_to_kueues_user_only(tmp_path: Path) -> None:
    objects = rendering.rbac(source.load(module_tree(tmp_path)))
    kinds = [(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects]
    assert kinds == [
        ("ClusterRole", "kueue-manager-role", None),
        ("ClusterRoleBinding", "kueue-manager-role", None),
        ("Role", "kueue-manager-secrets-role", "kueue-system"),
        ("RoleBinding", "kueue-manager-secrets-role", "kueue-system"),
        ("ClusterRole", "kueue-metrics-auth-role", None),
        ("ClusterRoleBinding", "kueue-metrics-auth-role", None),
    ]
    for binding in objects[1::2]:
        assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io",
                                        "kind": "User", "name": "fakefleet:kueue"}]
        assert binding["roleRef"]["name"] == binding["metadata"]["name"]


def test_configuration_listens_on_loopback_without_leader_election() -> None:
    ports = rendering.KueuePorts(webhook=1001, health=1002, metrics=1003)
    config = rendering.configuration(ports, Path("/state/kueue/pki"),
                                     rendering.MultiKueueSettings("30s"))
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["webhook"] == {"host": "127.0.0.1", "port": 1001,
                                 "certDir": "/state/kueue/pki"}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:1002"
    assert config["metrics"]["bindAddress"] == "127.0.0.1:1003"
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["integrations"]["frameworks"] == ["batch/job"]
    assert config["multiKueue"]["workerLostTimeout"] == "30s"
    assert "multiKueue" not in rendering.configuration(ports, Path("/x"), None)


def test_argv_names_config_and_kubeconfig() -> None:
    assert rendering.argv(Path("/c/kueue"), config=Path("/s/config.yaml"),
                          kubeconfig=Path("/s/kubeconfig"))[:3] == [
        "/c/kueue", "--config=/s/config.yaml", "--kubeconfig=/s/kubeconfig"]


# -- planning ----------------------------------------------------------------------------------

def test_no_addon_no_actions_no_condition() -> None:
    assert planning.plan(cluster(), Observed()) == []
    assert planning.condition(cluster(), Observed()) is None


def test_missing_binary_is_built_in_the_background_and_said() -> None:
    kueue = cluster(addons={"kueue": {}})
    assert planning.plan(kueue, Observed(control_plane_running=True)) == [Build()]
    building_ = Observed(control_plane_running=True, building_for=42.0)
    assert planning.plan(kueue, building_) == []
    state = planning.condition(kueue, building_)
    assert state is not None
    assert not state.ready
    assert state.reason == "Building"
    assert "(42s so far)" in state.message


def test_kueue_starts_then_hooks_then_runs() -> None:
    kueue = cluster(addons={"kueue": {}})
    started = Observed(control_plane_running=True, binary=True)
    assert planning.plan(kueue, started) == [Start()]
    ready = Observed(control_plane_running=True, binary=True, supervised=True, ready=True)
    assert planning.plan(kueue, ready) == [Hook()]
    assert planning.plan(kueue, RUNNING) == []
    assert planning.condition(kueue, RUNNING) == AddonState(
        True, "Running", "Kueue v0.17.0 running, webhooks at https://127.0.0.1:9443")


def test_waits_for_the_control_plane() -> None:
    kueue = cluster(addons={"kueue": {}})
    assert planning.plan(kueue, Observed(binary=True)) == []
    state = planning.condition(kueue, Observed(binary=True))
    assert state is not None
    assert state.reason == "Waiting"


def test_crash_is_reported_with_the_log() -> None:
    crashed = Observed(control_plane_running=True, binary=True, supervised=True, restarts=2,
                       log_tail='{"level":"info","msg":"hi"}\npanic: parsing "readyz"\n'
                                'goroutine 1 [running]:\n\tmain.go:393\n')
    state = planning.condition(cluster(addons={"kueue": {}}), crashed)
    assert state is not None
    assert state.reason == "Crashed"
    assert state.message == ('Kueue exited and was restarted 2 times: panic: parsing "readyz"')


def test_crash_summary_reads_kueues_json_log() -> None:
    log = ('{"level":"error","msg":"Unable to start manager","error":"no route"}\n'
           '{"level":"info","msg":"bye"}\n')
    assert lifecycle.crash_summary(log) == "Unable to start manager: no route"
    assert lifecycle.crash_summary("just text\n") == "just text"
    assert lifecycle.crash_summary("") == "(its log is empty)"


def test_removed_or_disabled_addon_stops_kueue() -> None:
    for spec in ({}, {"addons": {"kueue": {"enabled": False}}}):
        assert planning.plan(cluster(**spec), RUNNING) == [Stop()]
    assert planning.plan(cluster(), Observed(installed=True)) == [Stop()]


def workers(**overrides: Any) -> tuple[Worker, ...]:
    base: dict[str, Any] = {"exists": True, "kueue": True, "active": True}
    return (Worker("a", **{**base, "kubeconfig": "config-a", **overrides}),
            Worker("b", **{**base, "kubeconfig": "config-b"}))


def test_manager_applies_multikueue_objects_once() -> None:
    observed = Observed(**{**RUNNING.__dict__, "workers": workers()})
    (action,) = planning.plan(cluster(**MANAGER), observed)
    assert isinstance(action, ApplyMultiKueue)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in action.objects]
    assert kinds == [("Secret", "fakefleet-worker-a"), ("MultiKueueCluster", "a"),
                     ("Secret", "fakefleet-worker-b"), ("MultiKueueCluster", "b"),
                     ("MultiKueueConfig", "fakefleet")]
    secret, mkc = action.objects[0], action.objects[1]
    assert base64.b64decode(secret["data"]["kubeconfig"]).decode() == "config-a"
    assert secret["metadata"]["namespace"] == "kueue-system"
    assert mkc["spec"] == {"clusterSource": {"kubeConfig": {
        "locationType": "Secret", "location": "fakefleet-worker-a"}}}
    assert action.objects[-1]["spec"] == {"clusters": ["a", "b"]}
    applied = Observed(**{**observed.__dict__, "multikueue_applied": action.fingerprint})
    assert planning.plan(cluster(**MANAGER), applied) == []
    changed = Observed(**{**applied.__dict__, "workers": workers(kubeconfig="config-a2")})
    assert isinstance(planning.plan(cluster(**MANAGER), changed)[0], ApplyMultiKueue)


def test_nothing_half_made_while_a_worker_kubeconfig_is_unknown() -> None:
    observed = Observed(**{**RUNNING.__dict__, "workers": workers(kubeconfig="")})
    assert planning.plan(cluster(**MANAGER), observed) == []


@pytest.mark.parametrize(("worker", "says"), [
    ({"exists": False}, "names FakeCluster default/a, which does not exist: create it"),
    ({"kueue": False}, "which runs no Kueue: MultiKueue needs Kueue on every worker"),
])
def test_worker_problems_name_the_field_and_the_fix(worker: dict[str, Any], says: str) -> None:
    observed = Observed(**{**RUNNING.__dict__, "workers": workers(**worker)})
    state = planning.condition(cluster(**MANAGER), observed)
    assert state is not None
    assert not state.ready
    assert state.reason == "WorkerMissing"
    assert state.message.startswith("spec.addons.kueue.multiKueue.workers names")
    assert says in state.message


def test_worker_activity_is_told() -> None:
    observed = Observed(**{**RUNNING.__dict__, "workers": workers(
        active=False, inactive_reason="ClientConnectionFailed")})
    state = planning.condition(cluster(**MANAGER), observed)
    assert state is not None
    assert state.ready
    assert state.message.endswith("MultiKueue workers: a Inactive (ClientConnectionFailed), "
                                  "b Active")


def test_cluster_is_ready_only_with_kueue() -> None:
    up = cluster_planning.Observed(control_plane_running=True, secret_current=True,
                                   engine_running=True, endpoint="https://127.0.0.1:1")
    waiting = AddonState(False, "Building", "building Kueue")
    kueue_waiting = cluster_planning.Observed(**{**up.__dict__, "addons": (
        (planning.CONDITION, waiting),)})
    status = cluster_planning.status(cluster(addons={"kueue": {}}), kueue_waiting, now=NOW,
                                     previous=None)
    assert status.phase == "Provisioning"
    ready = {c.type: c for c in status.conditions}
    assert ready["Ready"].status == "False"
    assert ready["Ready"].reason == "KueueNotReady"
    assert ready["Ready"].message == "Kueue: building Kueue"
    assert ready["KueueReady"].reason == "Building"
    kueue_running = cluster_planning.Observed(**{**up.__dict__, "addons": (
        (planning.CONDITION, AddonState(True, "Running", "ok")),)})
    status = cluster_planning.status(cluster(addons={"kueue": {}}), kueue_running, now=NOW,
                                     previous=None)
    assert status.phase == "Ready"
    assert {c.type: c.status for c in status.conditions}["KueueReady"] == "True"


# -- CLI -----------------------------------------------------------------------------------------

def test_install_patch() -> None:
    assert kueue_cli.install_patch([], None) == {
        "spec": {"addons": {"kueue": {"enabled": True, "multiKueue": None}}}}
    assert kueue_cli.install_patch(["a", "b"], "1m") == {"spec": {"addons": {"kueue": {
        "enabled": True, "multiKueue": {"workers": ["a", "b"], "workerLostTimeout": "1m"}}}}}


def test_install_waits_for_the_current_generation() -> None:
    found = {"metadata": {"generation": 3}, "status": {"conditions": [
        {"type": "KueueReady", "status": "True", "reason": "Running", "message": "ok",
         "observedGeneration": 2}]}}
    assert kueue_cli.kueue_condition(found) == (False, "Running", "ok")
    found["status"]["conditions"][0]["observedGeneration"] = 3
    assert kueue_cli.kueue_condition(found)[0]
    assert kueue_cli.kueue_condition({"metadata": {}})[1] == "Pending"


# -- I/O: the MultiKueue objects through the client, on the in-memory API --------------------

async def test_multikueue_objects_are_applied_and_stale_workers_pruned() -> None:
    api = MemoryTransport(FakeClock())
    client = Client(api, clock=FakeClock())
    label = {"app.kubernetes.io/managed-by": "fakefleet"}
    api.put("/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/gone",
            {"metadata": {"name": "gone", "labels": label}})
    api.put("/api/v1/namespaces/kueue-system/secrets/fakefleet-worker-gone",
            {"metadata": {"name": "fakefleet-worker-gone", "labels": label}})
    api.put("/api/v1/namespaces/kueue-system/secrets/users-own",
            {"metadata": {"name": "users-own"}})
    observed = Observed(**{**RUNNING.__dict__, "workers": workers()})
    (action,) = planning.plan(cluster(**MANAGER), observed)
    assert isinstance(action, ApplyMultiKueue)
    await running.apply_multikueue(client, action, key="default.manager")
    clusters = api.objects("/apis/kueue.x-k8s.io/v1beta2/multikueueclusters")
    assert sorted(c["metadata"]["name"] for c in clusters) == ["a", "b"]
    secrets = api.objects("/api/v1/namespaces/kueue-system/secrets")
    assert sorted(s["metadata"]["name"] for s in secrets) == [
        "fakefleet-worker-a", "fakefleet-worker-b", "users-own"]
    config = api.object("/apis/kueue.x-k8s.io/v1beta2/multikueueconfigs/fakefleet")
    assert config is not None
    assert config["spec"] == {"clusters": ["a", "b"]}
    applies = api.sent("PATCH")
    assert {r.content_type for r in applies} == {"application/apply-patch+yaml"}
    assert ("fieldManager", "fakefleet-kueue") in applies[0].params
    # Applied again (an operator restart): the same objects, nothing deleted.
    await running.apply_multikueue(client, action, key="default.manager")
    assert len(api.objects("/apis/kueue.x-k8s.io/v1beta2/multikueueclusters")) == 2
    assert not api.sent("DELETE", "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/[ab]")


# -- the example -------------------------------------------------------------------------------

EXAMPLE = Path(__file__).parent.parent / "examples" / "multikueue"


def test_example_fleet_is_valid_and_wired() -> None:
    docs = list(yaml.safe_load_all((EXAMPLE / "clusters.yaml").read_text()))
    clusters = {d["metadata"]["name"]: FakeCluster.model_validate(d) for d in docs
                if d["kind"] == "FakeCluster"}
    manager = clusters["mk-manager"]
    assert planning.worker_names(manager) == ["mk-worker-a", "mk-worker-b"]
    for worker in planning.worker_names(manager):
        assert clusters[worker].spec.kueue is not None
    pools = [d for d in docs if d["kind"] == "FakeNodePool"]
    assert {p["spec"]["clusterRef"] for p in pools} == {"mk-worker-a", "mk-worker-b"}


def test_example_jobs_go_to_the_manager_queue_with_a_run_time() -> None:
    jobs = list(yaml.safe_load_all((EXAMPLE / "jobs.yaml").read_text()))
    assert len(jobs) == 8
    for job in jobs:
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"
        template = job["spec"]["template"]
        assert template["metadata"]["annotations"]["fakefleet.dev/run-time"] == "20s"
        gpus = int(template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert gpus <= 8
    checks = [d for d in yaml.safe_load_all((EXAMPLE / "manager-queues.yaml").read_text())
              if d["kind"] == "AdmissionCheck"]
    assert checks[0]["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"
    assert checks[0]["spec"]["parameters"]["name"] == "fakefleet"
