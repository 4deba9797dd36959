"""Every verb on every resource the operator and its engines use in the host cluster: the one
list the chart's RBAC is generated from, and that the operator checks at start.

Read off the code that talks to the host (the handlers, the hub link, the engines' pool watch
and status writes, the Kueue add-on's reads of workers' Secrets, FaultPlan expectations on
``cluster: host`` objects of fakefleet's kinds, Replays' traces in ConfigMaps) and kopf's own
needs (watching the four kinds, patching their annotations and finalizers, posting Events; CRDs
watched only when the operator watches every namespace). Members' API servers are reached with
their own admin credentials and need nothing here.

``make generate`` writes the rules into ``charts/fakefleet/files/`` (the chart's Role or
ClusterRole includes them) and ``make verify`` fails when they drift. At start the operator
asks the API server (SelfSubjectAccessReview) whether it may do each of these and refuses to
run, naming each verb and resource it lacks, rather than fail later halfway through a
FakeCluster. A FaultPlan expectation on another kind of host object needs a rule of its own
(the chart's ``rbac.extraRules``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from operators.k8s.client import Client
from primitives.keys import GROUP

REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One RBAC rule, and why the operator needs it."""

    group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    why: str

    def render(self) -> dict[str, Any]:
        return {"apiGroups": [self.group], "resources": list(self.resources),
                "verbs": list(self.verbs)}


#: In every namespace the operator watches (a Role there, or a ClusterRole for all).
NAMESPACED = (
    Rule(GROUP, ("fakeclusters", "fakenodepools", "faultplans", "replays"),
         ("get", "list", "watch", "patch"),
         "kopf watches the four kinds and keeps its progress, last-handled spec and finalizer "
         "in their metadata; FaultPlans write fault entries into FakeClusters' and pools' "
         "annotations; engines watch their cluster's pools; expectations read host objects"),
    Rule(GROUP, ("fakeclusters/status", "fakenodepools/status", "faultplans/status",
                 "replays/status"),
         ("patch",), "the operator reports FakeCluster, FaultPlan and Replay status, engines "
                     "and the operator FakeNodePool status"),
    Rule(GROUP, ("fakeclusters/finalizers",), ("update",),
         "a member's kubeconfig Secret is owned by its FakeCluster with blockOwnerDeletion, "
         "which the OwnerReferencesPermissionEnforcement admission plugin allows only to who "
         "may update the owner's finalizers"),
    Rule(GROUP, ("faultplans",), ("create", "delete"),
         "a hub link runs the hub's fleet-wide plans as FaultPlans and deletes them when the "
         "hub stops a run"),
    Rule("", ("secrets",), ("get", "create", "update"),
         "each local member's kubeconfig Secret (created, replaced when it changes); adopted "
         "clusters' kubeconfigs, hub credentials and MultiKueue workers' kubeconfigs (read)"),
    Rule("", ("configmaps",), ("get", "create", "update"),
         "a FaultPlan's lists of victims too long for its status (owned by the plan, the "
         "garbage collector removes them with it); a Replay's trace (read)"),
    Rule("", ("events",), ("create",),
         "kopf's and the FaultPlans' Events (FaultInjected, FaultRecovered, ExpectationFailed)"),
)

#: Only when the operator watches every namespace: kopf follows CRDs as they come and go.
CLUSTER_WIDE = (
    Rule("apiextensions.k8s.io", ("customresourcedefinitions",), ("list", "watch"),
         "kopf watches CRDs to notice its kinds being installed or removed"),
)

#: Only with ``--install-crds``: the operator applies fakefleet's CRDs itself.
INSTALL_CRDS = (
    Rule("apiextensions.k8s.io", ("customresourcedefinitions",), ("get", "create", "update"),
         "--install-crds applies the CRDs (the chart installs them instead)"),
)


def required(*, cluster_wide: bool, install_crds: bool) -> list[tuple[Rule, bool]]:
    """Each rule, and whether it is namespaced."""
    rules = [(rule, True) for rule in NAMESPACED]
    if cluster_wide:
        rules += [(rule, False) for rule in CLUSTER_WIDE]
    if install_crds:
        rules += [(rule, False) for rule in INSTALL_CRDS]
    return rules


@dataclasses.dataclass(frozen=True)
class Access:
    """One verb on one resource (in one namespace, or "" for all or cluster-scoped)."""

    verb: str
    group: str
    resource: str
    namespace: str
    namespaced: bool

    def review(self) -> dict[str, Any]:
        resource, _, subresource = self.resource.partition("/")
        attributes: dict[str, Any] = {"verb": self.verb, "group": self.group,
                                      "resource": resource}
        if subresource:
            attributes["subresource"] = subresource
        if self.namespace:
            attributes["namespace"] = self.namespace
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}

    def describe(self) -> str:
        group = f" in API group {self.group!r}" if self.group else ""
        where = (f" in namespace {self.namespace}" if self.namespace else
                 " in all namespaces" if self.namespaced else "")
        return f"{self.verb} {self.resource}{group}{where}"


def accesses(*, namespaces: Sequence[str], install_crds: bool) -> list[Access]:
    """What to ask about: each verb of each rule, in each watched namespace (``namespaces``
    empty: the operator watches all of them)."""
    found = []
    for rule, namespaced in required(cluster_wide=not namespaces, install_crds=install_crds):
        places = (namespaces or [""]) if namespaced else [""]
        for namespace in places:
            for resource in rule.resources:
                for verb in rule.verbs:
                    found.append(Access(verb, rule.group, resource, namespace, namespaced))
    return found


async def missing(client: Client, wanted: Sequence[Access]) -> list[Access]:
    """Those of ``wanted`` the API server says the client may not do (SelfSubjectAccessReview,
    which every authenticated user may ask)."""
    async def allowed(access: Access) -> bool:
        answer = await client.create(REVIEWS, access.review())
        return bool((answer.get("status") or {}).get("allowed"))

    answers = await asyncio.gather(*(allowed(access) for access in wanted))
    return [access for access, ok in zip(wanted, answers, strict=True) if not ok]


def refusal(lacking: Sequence[Access], who: str) -> str:
    """What the operator says when it may not do all it must."""
    listed = "; ".join(access.describe() for access in lacking)
    return (f"forbidden: {who} may not {listed}. The operator needs this in the host cluster "
            f"and does not start without it: grant it (the chart's RBAC, rendered from "
            f"operators/handlers/permissions.py, does), or run it with a kubeconfig that may")


# -- the chart's copy ---------------------------------------------------------------------------

def render_rules(rules: Sequence[Rule]) -> str:
    """Rules as YAML for a Role or ClusterRole, each with its reason as a comment."""
    lines = ["# Generated from operators/handlers/permissions.py by 'make generate': do not edit."]
    for rule in rules:
        lines.append(f"# {rule.why}")
        text = yaml.safe_dump([rule.render()], default_flow_style=None, sort_keys=False)
        lines.append(text.rstrip())
    return "\n".join(lines) + "\n"


def write_chart_files(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rules in (("rbac-namespaced.yaml", NAMESPACED),
                        ("rbac-cluster-wide.yaml", CLUSTER_WIDE)):
        path = directory / name
        path.write_text(render_rules(rules))
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description="write the chart's RBAC rules")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    for path in write_chart_files(args.directory):
        print(path)


if __name__ == "__main__":
    main()
