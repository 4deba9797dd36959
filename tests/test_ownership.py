"""fakefleet never takes over an object it did not make: a user's Secret where a FakeCluster's
kubeconfig would go, a user's MultiKueueCluster, APIService or webhook in a member, stay as
they are and the status names them; what fakefleet made (marked, or made before the marker by
today's code: an owner reference, the fakefleet.dev/cluster label, its field manager) it keeps
writing."""

from __future__ import annotations

import base64
import types
from pathlib import Path
from typing import Any, cast

import pytest

from operators.addons.kueue import running as kueue
from operators.addons.kueue.planning import ApplyMultiKueue
from operators.addons.metricsserver import running as metrics_server
from operators.addons.running import Site
from operators.api.clusters import FakeCluster
from operators.handlers import clusters as handler
from operators.handlers.runtime import Runtime
from operators.k8s import owning
from operators.k8s.client import Client
from operators.k8s.errors import NotOwned
from operators.reconciling import clusters as planning
from primitives import keys
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

SECRETS = "/api/v1/namespaces/default/secrets"
SECRET = f"{SECRETS}/west-kubeconfig"
CLUSTER = FakeCluster.model_validate({
    "apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
    "metadata": {"name": "west", "namespace": "default", "uid": "uid-west", "generation": 1},
    "spec": {}})
USERS = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": "west-kubeconfig", "namespace": "default"},
         "data": {"kubeconfig": base64.b64encode(b"the user's own").decode()}}


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.api = MemoryTransport(FakeClock())
        self.host = Client(self.api, clock=FakeClock())
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
        local = types.SimpleNamespace(kubeconfig_path=kubeconfig)
        self.runtime = cast(Runtime, types.SimpleNamespace(
            host=self.host, substrate=types.SimpleNamespace(clusters={"default.west": local})))

    async def write_secret(self) -> None:
        await handler.execute(self.runtime, CLUSTER, "default.west",
                              planning.WriteKubeconfigSecret("west-kubeconfig"))

    def secret(self) -> dict[str, Any]:
        found = self.api.object(SECRET)
        assert found is not None
        return found


async def test_a_users_secret_where_the_kubeconfig_would_go_is_refused_and_left_as_it_is(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    world.api.put(SECRETS, dict(USERS))
    with pytest.raises(NotOwned, match="Secret default/west-kubeconfig exists and "
                                       "FakeCluster/west did not make it") as refused:
        await world.write_secret()
    assert "delete or rename it" in str(refused.value)
    secret = world.secret()
    assert secret["data"] == USERS["data"]
    assert "ownerReferences" not in secret["metadata"], "the cluster's deletion would take it"
    assert keys.OWNED_BY not in (secret["metadata"].get("annotations") or {})
    assert not world.api.sent("PUT")


async def test_the_kubeconfig_secret_is_made_marked_and_owned_by_its_cluster(
        tmp_path: Path) -> None:
    world = World(tmp_path)
    await world.write_secret()
    secret = world.secret()
    assert secret["metadata"]["annotations"][keys.OWNED_BY] == "FakeCluster/west"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-west"
    await world.write_secret()  # its own: replaced
    assert len(world.api.sent("PUT")) == 1


@pytest.mark.parametrize("made_by_todays_code", [
    {"ownerReferences": [{"apiVersion": "fakefleet.dev/v1alpha1", "kind": "FakeCluster",
                          "name": "west", "uid": "uid-west"}]},
    {"labels": {keys.CLUSTER: "west"}},
], ids=["owner reference", "cluster label"])
async def test_a_secret_made_before_the_marker_is_still_the_clusters(
        tmp_path: Path, made_by_todays_code: dict[str, Any]) -> None:
    world = World(tmp_path)
    world.api.put(SECRETS, {**USERS, "metadata": {**USERS["metadata"], **made_by_todays_code}})
    await world.write_secret()
    secret = world.secret()
    assert secret["metadata"]["annotations"][keys.OWNED_BY] == "FakeCluster/west"
    assert base64.b64decode(secret["data"]["kubeconfig"]) == b"apiVersion: v1\nkind: Config\n"


def test_a_cluster_whose_secret_is_not_its_own_is_stalled_naming_it() -> None:
    error = "Secret default/west-kubeconfig exists and FakeCluster/west did not make it"
    status = planning.status(CLUSTER, planning.Observed(
        control_plane_running=True, error=error, stalled=True), now="2026-12-02T00:00:00Z",
        previous=None)
    stalled = next(c for c in status.conditions if c.type == "Stalled")
    assert (status.phase, stalled.status, stalled.message) == ("Failed", "True", error)
    assert status.kubeconfigSecret == "", "nobody is to read the user's Secret as the cluster's"


async def test_an_object_replaced_meanwhile_is_judged_again() -> None:
    api = MemoryTransport(FakeClock())
    client = Client(api, clock=FakeClock())
    owner = owning.Owner("FakeCluster/west")
    path = "/api/v1/namespaces/default/configmaps/c"
    api.put("/api/v1/namespaces/default/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "default",
                     "annotations": {keys.OWNED_BY: "FakeCluster/west"}}})
    api.fail("PUT", path, status=409, reason="Conflict", times=1)
    await owning.apply(client, {"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": "c", "namespace": "default"},
                                "data": {"k": "v"}}, "configmaps", owner=owner)
    found = api.object(path)
    assert found is not None
    assert found["data"] == {"k": "v"}
    assert await owning.delete(client, path, owner=owning.Owner("FaultPlan/other")) is False
    assert api.object(path) is not None, "another writer's object stays"
    assert await owning.delete(client, path, owner=owner) is True
    assert api.object(path) is None


# -- in a member: the add-ons' objects ---------------------------------------------------------

MULTIKUEUE_CLUSTERS = "/apis/kueue.x-k8s.io/v1beta2/multikueueclusters"


def action() -> ApplyMultiKueue:
    return ApplyMultiKueue((
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
         "metadata": {"name": "worker", "labels": {"app.kubernetes.io/managed-by": "fakefleet"}},
         "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret",
                                                   "location": "fakefleet-worker-worker"}}}},
    ), "f")


async def test_a_users_multikueue_cluster_is_refused_and_never_pruned() -> None:
    api = MemoryTransport(FakeClock())
    client = Client(api, clock=FakeClock())
    users = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
             "metadata": {"name": "worker", "managedFields": [
                 {"manager": "kubectl-client-side-apply", "operation": "Update"}]},
             "spec": {"clusterSource": {"kubeConfig": {"location": "mine"}}}}
    api.put(MULTIKUEUE_CLUSTERS, users)
    with pytest.raises(NotOwned, match=r"MultiKueueCluster worker exists and Addon/kueue did "
                                       r"not make it.*written by kubectl-client-side-apply"):
        await kueue.apply_multikueue(client, action(), key="default.manager")
    found = api.object(f"{MULTIKUEUE_CLUSTERS}/worker")
    assert found is not None
    assert found["spec"]["clusterSource"]["kubeConfig"] == {"location": "mine"}


async def test_an_addons_object_applied_by_todays_code_is_still_its_own() -> None:
    api = MemoryTransport(FakeClock())
    client = Client(api, clock=FakeClock())
    api.put(MULTIKUEUE_CLUSTERS, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueCluster",
        "metadata": {"name": "worker", "managedFields": [
            {"manager": "fakefleet-kueue", "operation": "Apply"}]}, "spec": {}})
    await kueue.apply_multikueue(client, action(), key="default.manager")
    found = api.object(f"{MULTIKUEUE_CLUSTERS}/worker")
    assert found is not None
    assert found["metadata"]["annotations"][keys.OWNED_BY] == "Addon/kueue"


class MemberSite(Site):
    """A site whose member API is in memory."""

    def connect(self) -> Client:
        return Client(cast(Any, self.local).api, clock=FakeClock())


async def test_unhooking_leaves_a_users_apiservice_and_service(tmp_path: Path) -> None:
    api = MemoryTransport(FakeClock())
    apiservice = {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                  "metadata": {"name": "v1beta1.metrics.k8s.io"},
                  "spec": {"service": {"name": "their-metrics", "namespace": "monitoring"}}}
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "metrics-server", "namespace": "kube-system"}}
    api.put("/apis/apiregistration.k8s.io/v1/apiservices", apiservice)
    api.put("/api/v1/namespaces/kube-system/services", service)
    site = MemberSite(key="default.west", state=cast(Any, None), host=cast(Any, None),
                      local=cast(Any, types.SimpleNamespace(api=api)))
    await metrics_server.MetricsServer().unhook(site)
    assert api.object("/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io")
    assert api.object("/api/v1/namespaces/kube-system/services/metrics-server")
    assert not api.sent("DELETE")
