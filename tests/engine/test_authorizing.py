"""The engine's RBAC in a member: applied with the admin's credentials, again and again alike."""

from __future__ import annotations

import pytest

from operators.engine import authorizing
from operators.k8s.client import Client
from operators.k8s.errors import NotOwned
from tests.fakes.clocks import FakeClock
from tests.fakes.k8s import MemoryTransport

RBAC = "/apis/rbac.authorization.k8s.io/v1"


async def test_grant_binds_the_rules_to_the_engine_s_user_and_is_idempotent() -> None:
    clock = FakeClock()
    api = MemoryTransport(clock)
    admin = Client(api, clock=clock)
    await authorizing.grant(admin)
    await authorizing.grant(admin)  # the Lease namespace there, every object replaced
    role = api.object(f"{RBAC}/clusterroles/fakefleet:engine")
    assert role is not None
    assert role["rules"] == [rule.render() for rule in authorizing.CLUSTER]
    binding = api.object(f"{RBAC}/clusterrolebindings/fakefleet:engine")
    assert binding is not None
    assert binding["subjects"] == [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
                                    "name": "fakefleet-engine"}]
    assert binding["roleRef"]["kind"] == "ClusterRole"
    leases = api.object(f"{RBAC}/namespaces/kube-node-lease/roles/fakefleet:engine")
    assert leases is not None
    assert leases["rules"] == [rule.render() for rule in authorizing.LEASES]
    assert api.object(f"{RBAC}/namespaces/kube-node-lease/rolebindings/fakefleet:engine")
    assert api.object("/api/v1/namespaces/kube-node-lease") is not None
    sets = api.object(f"{RBAC}/namespaces/fakefleet-system/roles/fakefleet:engine")
    assert sets is not None
    assert sets["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "verbs": ["get", "list", "watch", "patch"]}], \
        "the fault sets: read, and marked done; nothing made, nothing deleted"
    assert api.object(f"{RBAC}/namespaces/fakefleet-system/rolebindings/fakefleet:engine")
    namespace = api.object("/api/v1/namespaces/fakefleet-system")
    assert namespace is not None
    assert namespace["metadata"]["annotations"]["fakefleet.dev/owned-by"] == "fakefleet"
    assert not api.sent("PUT", "/api/v1/namespaces/.*"), "a namespace is never replaced"


async def test_a_namespace_fakefleet_did_not_make_is_not_taken_over() -> None:
    clock = FakeClock()
    api = MemoryTransport(clock)
    api.put("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": "fakefleet-system"}})
    with pytest.raises(NotOwned, match="Namespace fakefleet-system exists and fakefleet did "
                                       "not make it"):
        await authorizing.grant(Client(api, clock=clock))
    assert api.object(f"{RBAC}/namespaces/fakefleet-system/roles/fakefleet:engine") is None


def test_no_rule_grants_more_than_the_engine_writes() -> None:
    """No wildcard, no secrets, no escalation: only the engine's own kinds."""
    for rule in authorizing.CLUSTER + authorizing.LEASES:
        assert "*" not in rule.verbs
        assert "*" not in rule.resources
        assert rule.group in ("", "resource.k8s.io", "coordination.k8s.io")
        assert not set(rule.resources) & {"secrets", "configmaps", "serviceaccounts"}
        assert not set(rule.verbs) & {"escalate", "bind", "impersonate"}
        assert rule.why
