"""The chart on a real kube-apiserver, and the operator run out of the chart's RBAC.

One host API server on the session's shared etcd (no operator of its own, so the operators
started here are the only ones watching it) holds the CRDs. The chart and the GitOps fleet pass
``hack/chart.sh`` (helm lint, helm template, server-side dry-run) against it. Then the real
operator, ``python -m operators``, runs with a token of the chart's ServiceAccount (TokenRequest)
after the chart's rendered RBAC is applied: with a kubeconfig holding that token and the Role
of its namespace (FakeCluster and pool Ready, scale, a FaultPlan synced again unchanged and
then replaced, delete; kstatus read all along), and as in a pod (KUBERNETES_SERVICE_HOST/PORT
and a service-account directory) with the ClusterRole of a chart serving every namespace.
A Role with one verb removed makes the operator refuse to start, naming verb and resource.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.conftest import eventually, kubectl, kubectl_json
from operators.controlplane import helm
from operators.controlplane.ports import free_port
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate

ROOT = Path(__file__).parent.parent
CHART = ROOT / "charts" / "fakefleet"
NAMESPACE = "chart-fleet"
RELEASE = "fakefleet"
#: The ServiceAccount the chart makes (the release's full name).
ACCOUNT = "fakefleet"


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    return helm.ensure(progress=print)


@pytest.fixture(scope="module")
async def host(substrate: Substrate) -> AsyncIterator[LocalCluster]:
    """A host cluster with fakefleet's CRDs and nothing watching it."""
    cluster = await substrate.add_cluster("chart-host", ClusterOptions(
        scheduler=False, controller_manager=False))
    kubectl(cluster.kubeconfig_path, "apply", "--server-side", "-f", str(CHART / "crds"))
    kubectl(cluster.kubeconfig_path, "wait", "--for=condition=Established", "--timeout=60s",
            "crd", "--all")
    try:
        yield cluster
    finally:
        await substrate.remove_cluster("chart-host", purge=True)


def render(helm_binary: Path, namespace: str, *values: str, release: str = RELEASE,
           only: tuple[str, ...] = ("serviceaccount", "rbac")) -> str:
    shown = [arg for name in only for arg in ("--show-only", f"templates/{name}.yaml")]
    return subprocess.run(
        [str(helm_binary), "template", release, str(CHART), "--namespace", namespace,
         *shown, *(arg for value in values for arg in ("--set", value))],
        capture_output=True, text=True, check=True, timeout=60).stdout


def apply(kubeconfig: Path, manifest: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "kubectl"), "--kubeconfig",
                           str(kubeconfig), "apply", *args, "-f", "-"], input=manifest,
                          capture_output=True, text=True, check=False, timeout=60)


def token_for(kubeconfig: Path, namespace: str, account: str) -> str:
    """A token of the ServiceAccount, through the TokenRequest API (as the kubelet gets one)."""
    return kubectl(kubeconfig, "-n", namespace, "create", "token", account,
                   "--duration=1h").stdout.strip()


def can(kubeconfig: Path, namespace: str, account: str, verb: str, resource: str,
        home: str = "") -> bool:
    """What the API server's authorizer says the ServiceAccount (of namespace ``home``, by
    default ``namespace``) may do in ``namespace``."""
    kind, _, subresource = resource.partition("/")
    answer = kubectl(kubeconfig, "auth", "can-i", verb, kind, "-n", namespace,
                     *([f"--subresource={subresource}"] if subresource else []),
                     f"--as=system:serviceaccount:{home or namespace}:{account}", check=False)
    return answer.stdout.strip() == "yes"


def token_kubeconfig(host: LocalCluster, token: str, path: Path) -> Path:
    admin = yaml.safe_load(host.kubeconfig_path.read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "host", "cluster": {"server": host.endpoint,
                                                  "certificate-authority-data": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "host", "user": "sa"}}]}))
    return path


def operator_ready(state: Path) -> bool:
    try:
        return bool(json.loads((state / "operator.json").read_text()).get("ready"))
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def operator(state: Path, *args: str, env: dict[str, str] | None = None,
             wait_ready: bool = True) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m operators`` on a state directory of its own (it runs its own etcd)."""
    state.mkdir(parents=True, exist_ok=True)
    log = state.parent / f"{state.name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "operators", "--state-dir", str(state), "--unsafe-no-fsync",
             *args], stdout=out, stderr=subprocess.STDOUT,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")},
                 **(env or {})})
    try:
        if wait_ready:
            eventually(lambda: operator_ready(state) or process.poll() is not None,
                       timeout=90, what="the operator to start")
            assert process.poll() is None, f"the operator exited: {log.read_text()[-3000:]}"
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def kstatus(obj: dict[str, Any]) -> str:
    """What kstatus (sigs.k8s.io/cli-utils, as Flux uses it) computes for a custom resource."""
    if obj["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = obj.get("status") or {}
    generation = obj["metadata"].get("generation")
    if generation is not None and "observedGeneration" in status and \
            status["observedGeneration"] != generation:
        return "InProgress"
    for condition in status.get("conditions") or []:
        if condition["type"] == "Reconciling" and condition["status"] == "True":
            return "InProgress"
        if condition["type"] == "Stalled" and condition["status"] == "True":
            return "Failed"
    return "Current"


def ready_condition(obj: dict[str, Any]) -> str:
    return next((c["status"] for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == "Ready"), "")


class Watcher:
    """Polls objects and keeps the kstatus of each as it changed, checking at every look that
    Current means Ready (never a FakeCluster or pool taken as done before it is)."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.seen: dict[str, list[str]] = {}

    def look(self, kind: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = kubectl_json(self.kubeconfig, "-n", self.namespace, "get", kind,
                                           name)
        state = kstatus(obj)
        if state == "Current" and kind in ("fc", "fnp"):
            assert ready_condition(obj) == "True", f"{kind}/{name} Current but not Ready: {obj}"
        history = self.seen.setdefault(f"{kind}/{name}", [])
        if not history or history[-1] != state:
            history.append(state)
        return obj

    def until(self, kind: str, name: str, state: str, timeout: float = 120,
              also: Any = None) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            obj = self.look(kind, name)
            return obj if kstatus(obj) == state and (also is None or also(obj)) else None

        result: dict[str, Any] = eventually(reached, timeout=timeout,
                                            what=f"{kind}/{name} {state}")
        return result


CLUSTER = """
apiVersion: fakefleet.dev/v1alpha1
kind: FakeCluster
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  controlPlane: {{scheduler: false, controllerManager: false}}
---
apiVersion: fakefleet.dev/v1alpha1
kind: FakeNodePool
metadata: {{name: {name}-cpu, namespace: {namespace}}}
spec: {{clusterRef: {name}, replicas: {replicas}}}
"""

PLAN = """
apiVersion: fakefleet.dev/v1alpha1
kind: FaultPlan
metadata: {{name: resync, namespace: {namespace}}}
spec:
  steps:
  - name: not-ready
    target:
      clusters: {{names: [{cluster}]}}
      nodes: {{pools: [{cluster}-cpu]}}
      mode: one
    fault: {{type: NotReady}}
    at: 1s
    duration: {duration}
    expectations:
    - name: ready-false
      within: 20s
      objects: {{kind: Node, victims: true}}
      condition: {{type: Ready, status: "False"}}
"""


def test_the_chart_and_the_gitops_fleet_pass_server_side_dry_run(
        host: LocalCluster, helm_binary: Path) -> None:
    run = subprocess.run([str(ROOT / "hack" / "chart.sh"), str(host.kubeconfig_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "PATH": f"{Path(sys.executable).parent}:"
                                                    f"{os.environ['PATH']}"})
    assert run.returncode == 0, run.stdout + run.stderr
    for line in ("deployment.apps/fakefleet serverside-applied (server dry run)",
                 "clusterrole.rbac.authorization.k8s.io/fakefleet serverside-applied",
                 "faultplan.fakefleet.dev/gitops-xid-79 serverside-applied (server dry run)",
                 "chart: lint, render and server-side dry-run passed"):
        assert line in run.stdout, run.stdout
    # Values the chart cannot use are refused by its schema, naming the field.
    bad = subprocess.run([str(helm_binary), "template", "x", str(CHART), "--set",
                          "controlPlane.profile=fast"], capture_output=True, text=True,
                         check=False, timeout=60)
    assert bad.returncode != 0
    assert "/controlPlane/profile" in bad.stderr
    assert "value must be one of 'default', 'load'" in bad.stderr


def test_a_verb_missing_from_the_role_stops_the_operator_naming_it(
        host: LocalCluster, helm_binary: Path, tmp_path: Path) -> None:
    namespace = "chart-denied"
    kubectl(host.kubeconfig_path, "create", "namespace", namespace)
    objects = list(yaml.safe_load_all(render(helm_binary, namespace)))
    for obj in objects:
        if obj["kind"] == "Role":
            for rule in obj["rules"]:
                if "fakeclusters/status" in rule["resources"]:
                    rule["resources"].remove("fakeclusters/status")
    assert apply(host.kubeconfig_path, yaml.safe_dump_all(objects)).returncode == 0
    eventually(lambda: can(host.kubeconfig_path, namespace, ACCOUNT, "patch",
                           "fakenodepools/status"), what="the Role to take effect")
    assert not can(host.kubeconfig_path, namespace, ACCOUNT, "patch", "fakeclusters/status")
    kubeconfig = token_kubeconfig(host, token_for(host.kubeconfig_path, namespace, ACCOUNT),
                                  tmp_path / "denied.kubeconfig")
    with operator(tmp_path / "denied", "--kubeconfig", str(kubeconfig), "--namespace",
                  namespace, wait_ready=False) as process:
        assert process.wait(timeout=60) == 1
    log = (tmp_path / "denied.log").read_text()
    assert (f"forbidden: the kubeconfig {kubeconfig} may not patch fakeclusters/status in API "
            f"group 'fakefleet.dev' in namespace {namespace}") in log, log
    assert "grant it (the chart's RBAC" in log
    kubectl(host.kubeconfig_path, "delete", "namespace", namespace, "--wait=false")


def test_the_operator_runs_a_fleet_with_the_charts_role_and_a_token(
        host: LocalCluster, helm_binary: Path, tmp_path: Path) -> None:
    """Ready, scale, a FaultPlan synced again and replaced, delete: kstatus all along."""
    admin = host.kubeconfig_path
    kubectl(admin, "create", "namespace", NAMESPACE)
    assert apply(admin, render(helm_binary, NAMESPACE)).returncode == 0
    eventually(lambda: can(admin, NAMESPACE, ACCOUNT, "patch", "fakeclusters/status"),
               what="the chart's Role to take effect")
    assert not can(admin, "default", ACCOUNT, "get", "secrets", home=NAMESPACE), \
        "a Role: nothing in other namespaces"
    kubeconfig = token_kubeconfig(host, token_for(admin, NAMESPACE, ACCOUNT),
                                  tmp_path / "sa.kubeconfig")
    watcher = Watcher(admin, NAMESPACE)
    with operator(tmp_path / "namespaced", "--kubeconfig", str(kubeconfig), "--namespace",
                  NAMESPACE):
        assert apply(admin, CLUSTER.format(name="alpha", namespace=NAMESPACE,
                                           replicas=2)).returncode == 0
        watcher.look("fc", "alpha")
        cluster = watcher.until("fc", "alpha", "Current")
        assert cluster["status"]["phase"] == "Ready"
        assert cluster["status"]["observedGeneration"] == cluster["metadata"]["generation"]
        pool = watcher.until("fnp", "alpha-cpu", "Current",
                             also=lambda p: p["status"].get("readyReplicas") == 2)
        assert watcher.seen["fc/alpha"][0] == "InProgress", watcher.seen

        kubectl(admin, "-n", NAMESPACE, "scale", "fnp/alpha-cpu", "--replicas=4")
        scaled = watcher.look("fnp", "alpha-cpu")
        assert scaled["metadata"]["generation"] == pool["metadata"]["generation"] + 1
        watcher.until("fnp", "alpha-cpu", "Current",
                      also=lambda p: p["status"].get("readyReplicas") == 4)
        assert "InProgress" in watcher.seen["fnp/alpha-cpu"][1:], watcher.seen

        _a_plan_runs_once_per_object(admin, watcher)

        kubectl(admin, "-n", NAMESPACE, "delete", "fnp", "alpha-cpu", "--timeout=60s")
        kubectl(admin, "-n", NAMESPACE, "delete", "fc", "alpha", "--wait=false")

        def gone() -> bool:
            found = kubectl(admin, "-n", NAMESPACE, "get", "fc", "alpha", "-o", "json",
                            check=False)
            if found.returncode != 0:
                return "NotFound" in found.stderr
            history = watcher.seen.setdefault("fc/alpha", [])
            if history[-1] != (state := kstatus(json.loads(found.stdout))):
                history.append(state)
            return False

        eventually(gone, timeout=60, what="FakeCluster alpha deleted")
        assert watcher.seen["fc/alpha"][-1] == "Terminating", watcher.seen
        eventually(lambda: not (tmp_path / "namespaced" / "clusters" /
                                f"{NAMESPACE}.alpha").exists(), timeout=30,
                   what="the member's state to be purged")
    log = (tmp_path / "namespaced.log").read_text()
    assert "allows all" in log
    for refusal in ("Forbidden", "Not enough permissions"):
        assert refusal not in log, log[-3000:]


def _a_plan_runs_once_per_object(admin: Path, watcher: Watcher) -> None:
    """Synced again unchanged (client-side apply, and server-side as Argo CD and Flux do), a
    finished FaultPlan stays as it is; a changed one is refused, and replaced it runs anew."""
    manifest = PLAN.format(namespace=NAMESPACE, cluster="alpha", duration="2s")
    assert apply(admin, manifest).returncode == 0
    done = watcher.until("fp", "resync", "Current",
                         also=lambda p: p["status"].get("phase") in ("Succeeded", "Failed"))
    assert done["status"]["verdict"] == "Passed", done["status"]
    for args in ((), ("--server-side", "--field-manager=argocd-controller"),
                 ("--server-side", "--field-manager=kustomize-controller", "--force-conflicts")):
        assert apply(admin, manifest, *args).returncode == 0
    time.sleep(3)  # what would have run again, had the syncs started anything
    again = watcher.look("fp", "resync")
    assert again["metadata"]["uid"] == done["metadata"]["uid"]
    assert again["metadata"]["generation"] == done["metadata"]["generation"] == 1
    assert again["status"] == done["status"], "a re-sync must not run the plan again"

    changed = PLAN.format(namespace=NAMESPACE, cluster="alpha", duration="3s")
    refused = apply(admin, changed)
    assert refused.returncode != 0
    assert "spec is immutable: delete the FaultPlan and apply it again" in refused.stderr
    replaced = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", str(admin), "replace",
         "--force", "-f", "-"], input=changed, capture_output=True, text=True, timeout=120,
        check=False)  # what Argo CD's Force=true,Replace=true and Flux's force do
    assert replaced.returncode == 0, replaced.stderr
    rerun = watcher.until("fp", "resync", "Current",
                          also=lambda p: p["metadata"]["uid"] != done["metadata"]["uid"]
                          and p["status"].get("phase") in ("Succeeded", "Failed"))
    assert rerun["status"]["verdict"] == "Passed"
    assert rerun["status"]["startedAt"] != done["status"]["startedAt"]
    kubectl(admin, "-n", NAMESPACE, "delete", "fp", "resync", "--timeout=60s")


def test_the_operator_runs_in_a_pod_with_the_charts_cluster_role(
        host: LocalCluster, helm_binary: Path, tmp_path: Path) -> None:
    """In-cluster configuration (service host and port, token and CA files), every namespace."""
    admin = host.kubeconfig_path
    release, namespace, elsewhere = "wide", "chart-system", "chart-tenant"
    for name in (namespace, elsewhere):
        kubectl(admin, "create", "namespace", name)
    assert apply(admin, render(helm_binary, namespace, "watch.allNamespaces=true",
                               release=release)).returncode == 0
    account = f"{release}-fakefleet"
    eventually(lambda: can(admin, elsewhere, account, "patch", "fakeclusters/status",
                           home=namespace), what="the chart's ClusterRole to take effect")
    secrets = tmp_path / "serviceaccount"
    secrets.mkdir()
    (secrets / "token").write_text(token_for(admin, namespace, account))
    admin_config = yaml.safe_load(admin.read_text())
    (secrets / "ca.crt").write_bytes(base64.b64decode(
        admin_config["clusters"][0]["cluster"]["certificate-authority-data"]))
    (secrets / "namespace").write_text(namespace)
    pod = {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(host.ports.apiserver)}
    watcher = Watcher(admin, elsewhere)
    health = free_port()
    with operator(tmp_path / "in-pod", "--service-account-dir", str(secrets),
                  f"--liveness=127.0.0.1:{health}", env=pod):
        # What the chart's probes ask.
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=10) as probe:
            assert probe.status == 200
        assert apply(admin, CLUSTER.format(name="beta", namespace=elsewhere,
                                           replicas=1)).returncode == 0
        watcher.until("fc", "beta", "Current")
        watcher.until("fnp", "beta-cpu", "Current",
                      also=lambda p: p["status"].get("readyReplicas") == 1)
        kubectl(admin, "-n", elsewhere, "delete", "fnp", "beta-cpu", "--timeout=60s")
        kubectl(admin, "-n", elsewhere, "delete", "fc", "beta", "--timeout=60s")
    log = (tmp_path / "in-pod.log").read_text()
    assert f"the pod's service account ({secrets})" in log, log[-3000:]
    for refusal in ("Forbidden", "Not enough permissions"):
        assert refusal not in log, log[-3000:]
