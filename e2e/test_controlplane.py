"""Local control planes on real upstream binaries: readiness, isolation, supervision, purge,
etcd over TLS with client certificates, private state."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import stat
import sys
import time
from pathlib import Path

from e2e.conftest import eventually, kubectl, kubectl_json
from operators.controlplane import components, health
from operators.controlplane.binaries import DEFAULT_KUBERNETES_VERSION
from operators.controlplane.substrate import ClusterOptions, LocalCluster, Substrate

APISERVER_ONLY = ClusterOptions(scheduler=False, controller_manager=False)


async def _alpha(substrate: Substrate) -> LocalCluster:
    return await substrate.add_cluster("alpha")


async def test_apiserver_is_ready_and_reports_the_pinned_version(substrate: Substrate) -> None:
    alpha = await _alpha(substrate)
    assert kubectl(alpha.kubeconfig_path, "get", "--raw", "/readyz").stdout.strip() == "ok"
    version = kubectl_json(alpha.kubeconfig_path, "version")
    assert version["serverVersion"]["gitVersion"] == DEFAULT_KUBERNETES_VERSION
    names = {c.name for c in substrate.components() if c.cluster == "alpha"}
    assert names == {"kube-apiserver", "kube-scheduler", "kube-controller-manager"}


async def test_two_apiservers_on_one_etcd_do_not_see_each_other(substrate: Substrate) -> None:
    alpha = await _alpha(substrate)
    beta = await substrate.add_cluster("beta", APISERVER_ONLY)
    assert alpha.ports.apiserver != beta.ports.apiserver
    kubectl(alpha.kubeconfig_path, "create", "namespace", "only-in-alpha")
    assert kubectl(alpha.kubeconfig_path, "get", "namespace", "only-in-alpha").returncode == 0
    missing = kubectl(beta.kubeconfig_path, "get", "namespace", "only-in-alpha", check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr
    # Credentials of one cluster do not open another: each has its own CA.
    foreign = kubectl(alpha.kubeconfig_path, "--server", beta.endpoint, "get", "ns", check=False)
    assert foreign.returncode != 0


async def test_controller_manager_turns_a_deployment_into_pods(substrate: Substrate) -> None:
    alpha = await _alpha(substrate)
    kubeconfig = alpha.kubeconfig_path
    kubectl(kubeconfig, "create", "namespace", "kcm")
    kubectl(kubeconfig, "-n", "kcm", "create", "deployment", "web",
            "--image=registry.k8s.io/pause:3.10", "--replicas=2")

    def pods() -> list[dict[str, object]]:
        items: list[dict[str, object]] = kubectl_json(kubeconfig, "-n", "kcm", "get", "pods")[
            "items"]
        return items if len(items) == 2 else []

    found = await asyncio.to_thread(eventually, pods, what="2 pods from the Deployment")
    replicasets = kubectl_json(kubeconfig, "-n", "kcm", "get", "replicasets")["items"]
    assert len(replicasets) == 1
    assert replicasets[0]["metadata"]["ownerReferences"][0]["name"] == "web"
    for pod in found:
        assert pod["status"]["phase"] == "Pending"  # type: ignore[index]


async def test_killed_apiserver_is_restarted_and_keeps_its_data(substrate: Substrate) -> None:
    beta = await substrate.add_cluster("beta", APISERVER_ONLY)
    kubeconfig = beta.kubeconfig_path
    kubectl(kubeconfig, "create", "configmap", "survivor", "--from-literal=k=v")
    old_pid = beta.apiserver.pid
    assert old_pid is not None
    os.kill(old_pid, signal.SIGKILL)

    deadline = time.monotonic() + 90
    while True:
        healthy, _ = await health.probe(f"{beta.endpoint}/readyz", beta.admin_tls())
        if healthy and beta.apiserver.pid not in (None, old_pid):
            break
        assert time.monotonic() < deadline, "the apiserver was not restarted in time"
        await asyncio.sleep(0.25)
    assert beta.apiserver.restarts >= 1
    data = kubectl_json(kubeconfig, "get", "configmap", "survivor")["data"]
    assert data == {"k": "v"}


async def test_removing_a_cluster_purges_its_data_only(substrate: Substrate) -> None:
    alpha = await _alpha(substrate)
    gamma = await substrate.add_cluster("gamma", APISERVER_ONLY)
    kubectl(gamma.kubeconfig_path, "create", "namespace", "doomed")
    prefix = components.etcd_prefix("gamma") + "/"
    assert await substrate.count_etcd_keys(prefix) > 0
    alpha_keys = await substrate.count_etcd_keys(components.etcd_prefix("alpha") + "/")
    pid = gamma.apiserver.pid

    await substrate.remove_cluster("gamma", purge=True)

    assert await substrate.count_etcd_keys(prefix) == 0
    assert not gamma.directory.exists()
    assert pid is not None
    assert gamma.apiserver.pid is None
    assert await substrate.count_etcd_keys(components.etcd_prefix("alpha") + "/") >= alpha_keys
    assert kubectl(alpha.kubeconfig_path, "get", "--raw", "/readyz").stdout.strip() == "ok"


async def test_the_longest_cluster_key_gets_a_working_control_plane(substrate: Substrate) -> None:
    key = "n" * 63 + "." + "c" * 63  # a 63-character namespace and a 63-character name
    cluster = await substrate.add_cluster(key, APISERVER_ONLY)
    assert kubectl(cluster.kubeconfig_path, "get", "--raw", "/readyz").stdout.strip() == "ok"
    await substrate.remove_cluster(key, purge=True)


async def test_etcd_refuses_plain_http_and_clients_without_its_certificate(
    substrate: Substrate,
) -> None:
    etcd = substrate.etcd
    assert etcd.url.startswith("https://127.0.0.1:")
    plain, _ = await health.probe(etcd.health_url.replace("https://", "http://", 1))
    assert not plain, "etcd answered plain http"
    no_certificate = ssl.create_default_context(cafile=str(etcd.pki.ca_cert))
    anonymous, detail = await health.probe(etcd.health_url, no_certificate)
    assert not anonymous, "etcd answered a TLS client without a certificate"
    assert "CERTIFICATE_REQUIRED" in detail
    # A cluster's credentials do not open etcd: it trusts its own CA only.
    alpha = await _alpha(substrate)
    foreign, _ = await health.probe(etcd.health_url, alpha.admin_tls())
    assert not foreign, "etcd answered a certificate of a cluster's CA"
    healthy, _ = await health.probe(etcd.health_url, etcd.tls())
    assert healthy


async def test_state_is_private(substrate: Substrate) -> None:
    alpha = await _alpha(substrate)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(substrate.state_dir) == 0o700
    for client in ("admin", "kube-scheduler", "kube-controller-manager", "engine"):
        assert mode(alpha.kubeconfig_of(client)) == 0o600, client
    keys = [*alpha.pki.directory.glob("*.key"), *substrate.etcd.pki.directory.glob("*.key")]
    assert len(keys) == 7 + 5  # the cluster's: CA, serving, four clients, service accounts
    for key in keys:
        assert mode(key) == 0o600, key


async def test_a_standalone_operator_restarts_on_its_own_state(substrate: Substrate,
                                                               tmp_path: Path) -> None:
    """`python -m operators --state-dir DIR --kubeconfig HOST` on a host cluster of its own:
    killed, it starts again on the same DIR (it took the etcd files its first run left behind
    for a shared etcd's, and exited)."""
    host = await substrate.add_cluster("standalone-host", ClusterOptions(
        scheduler=False, controller_manager=False))
    state = tmp_path / "operator"

    def ready() -> bool:
        try:
            return bool(json.loads((state / "operator.json").read_text()).get("ready"))
        except (OSError, ValueError):
            return False

    for run in (1, 2):
        (state / "operator.json").unlink(missing_ok=True)
        with (tmp_path / f"operator-{run}.log").open("wb") as log:
            operator = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "operators", "--state-dir", str(state), "--kubeconfig",
                str(host.kubeconfig_path), "--install-crds", "--unsafe-no-fsync",
                stdout=log, stderr=asyncio.subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while not ready() and operator.returncode is None and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert ready(), (f"run {run}: not ready (exit {operator.returncode}): "
                             f"{(tmp_path / f'operator-{run}.log').read_text()[-2000:]}")
        finally:
            if operator.returncode is None:
                operator.kill()
            await operator.wait()
    await substrate.remove_cluster("standalone-host", purge=True)
