"""What the engine may do in a local member, as RBAC grants it to the engine's own identity
(user ``fakefleet-engine`` in group ``system:nodes``, :data:`operators.controlplane.pki.ENGINE`):
exactly what it sends, read off its requests (every engine test checks that each request it
sent is covered, ``tests/engine/conftest.py``), and nothing more.

As the kubelets' group it is served by the API server's priority and fairness as kubelets
are: upstream's FlowSchema ``system-node-high`` puts its node and Lease writes at the
``node-high`` priority level, ``system-nodes`` the rest at ``system``, both ahead of workload
traffic. Its name is outside ``system:node:<name>``, so the Node authorizer abstains and RBAC
alone decides (the engine writes for every node of the cluster, not one).

:func:`grant` applies the rules with the member's admin credentials before the engine starts;
an adopted cluster (``backend: external``) is left as it is, and its engine uses the
kubeconfig it was given.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from operators.api import faultsets
from operators.controlplane.pki import ENGINE_USER
from operators.engine.heartbeating import LEASE_NAMESPACE
from operators.k8s import owning
from operators.k8s.applying import apply
from operators.k8s.client import Client
from operators.k8s.errors import Conflict

NAME = "fakefleet:engine"
RBAC = "rbac.authorization.k8s.io"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One RBAC rule, and why the engine needs it."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def render(self) -> dict[str, Any]:
        return {"apiGroups": [self.group], "resources": list(self.resources),
                "verbs": list(self.verbs)}


#: In the whole cluster (a ClusterRole).
CLUSTER = (
    Rule("", ("nodes",), ("get", "list", "watch", "create", "patch", "delete"),
         "the node watch; the pools' nodes made, reshaped (read again on a conflict), their "
         "taints and cordons written, scaled away"),
    Rule("", ("nodes/status",), ("patch",), "node stages (conditions, allocatable), reshapes"),
    Rule("", ("pods",), ("list", "watch", "delete"),
         "the watch of bound pods; a deleted pod finalised after its grace period"),
    Rule("", ("pods/status",), ("patch",), "every stage of a pod's life, and its status "
                                           "written back when another writer changed it"),
    Rule("", ("events",), ("create",), "Events of pods and nodes (InvalidAnnotation, stages', "
                                       "NodeNotManaged)"),
    Rule("resource.k8s.io", ("resourceslices",),
         ("get", "list", "watch", "create", "patch", "delete"),
         "each DRA node's ResourceSlice of its GPUs, published, changed and withdrawn"),
    Rule("resource.k8s.io", ("deviceclasses",), ("create",),
         "the DeviceClass gpu.fakefleet.dev, made once"),
    Rule("resource.k8s.io", ("resourceclaims",), ("get",),
         "a pod's claims read before it starts, as the kubelet's DRA manager reads them"),
)

#: In kube-node-lease (a Role there).
LEASES = (
    Rule("coordination.k8s.io", ("leases",), ("list", "create", "patch", "delete"),
         "every node's Lease: read once at start, made, renewed, deleted with its node"),
)


#: In fakefleet-system (a Role there): the fault sets and a replay's lives sets, and nothing
#: else of the namespace.
FAULT_SETS = (
    Rule("", ("configmaps",), ("get", "list", "watch", "patch"),
         "the fault sets watched; one marked done once its targets ran its stages (read "
         "again on a conflict); a lives set read, and the ordinal a pod took written in it"),
)


def manifests() -> list[tuple[dict[str, Any], str]]:
    """The RBAC objects (with their plurals) that give the engine's identity its rules."""
    subjects = [{"kind": "User", "apiGroup": RBAC, "name": ENGINE_USER}]
    role_ref = {"apiGroup": RBAC, "name": NAME}
    version = f"{RBAC}/v1"
    in_leases = {"name": NAME, "namespace": LEASE_NAMESPACE}
    in_sets = {"name": NAME, "namespace": faultsets.NAMESPACE}
    return [
        ({"apiVersion": version, "kind": "ClusterRole", "metadata": {"name": NAME},
          "rules": [rule.render() for rule in CLUSTER]}, "clusterroles"),
        ({"apiVersion": version, "kind": "ClusterRoleBinding", "metadata": {"name": NAME},
          "roleRef": {**role_ref, "kind": "ClusterRole"}, "subjects": subjects},
         "clusterrolebindings"),
        ({"apiVersion": version, "kind": "Role", "metadata": in_leases,
          "rules": [rule.render() for rule in LEASES]}, "roles"),
        ({"apiVersion": version, "kind": "RoleBinding", "metadata": in_leases,
          "roleRef": {**role_ref, "kind": "Role"}, "subjects": subjects}, "rolebindings"),
        ({"apiVersion": version, "kind": "Role", "metadata": in_sets,
          "rules": [rule.render() for rule in FAULT_SETS]}, "roles"),
        ({"apiVersion": version, "kind": "RoleBinding", "metadata": in_sets,
          "roleRef": {**role_ref, "kind": "Role"}, "subjects": subjects}, "rolebindings"),
    ]


async def grant(admin: Client) -> None:
    """Apply the engine's RBAC in a member (``admin``: its admin client). Idempotent; the
    Lease namespace, which the API server makes once it runs, is made here if it is not yet,
    and so is fakefleet's own (NotOwned if one fakefleet did not make stands there)."""
    try:
        await admin.create("/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NAMESPACE}},
            decode=False)
    except Conflict as error:
        if not error.already_exists:
            raise
    await owning.ensure_namespace(admin, faultsets.NAMESPACE,
                                  owner=owning.Owner(faultsets.NAMESPACE_WRITER))
    for obj, plural in manifests():
        await apply(admin, obj, plural)
