"""What the kubelet's DRA manager checks before it starts a pod: the ResourceClaims the pod
uses, and whether each lets it. Pure: no I/O.

A pod names its claims in ``spec.resourceClaims``: directly (``resourceClaimName``) or through
a template, whose claim the controller-manager creates and names in the pod's
``status.resourceClaimStatuses`` (a null name there: the claim is not needed). A claim is
prepared for a pod once it is reserved for it (``status.reservedFor`` holds the pod's uid),
which the scheduler does when it has allocated the claim, before it binds the pod; a
template's claim must also be owned by the pod. A pod bound to a node whose claims are not so
(made with ``spec.nodeName`` set, so the scheduler never allocated them) stays Pending as the
kubelet keeps it, with the kubelet's own words in a FailedPrepareDynamicResources Event.

Once its claims are prepared the engine plays every DRA driver's kubelet plugin at once
(NodePrepareResources): on a fake node there is nothing to prepare, so the pod starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
EVENT_REASON = "FailedPrepareDynamicResources"


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimRef:
    """One entry of ``spec.resourceClaims``."""

    name: str
    claim: str | None  # resourceClaimName
    template: str | None  # resourceClaimTemplateName


def claim_refs(spec: Mapping[str, Any]) -> tuple[ClaimRef, ...]:
    return tuple(ClaimRef(str(entry.get("name", "")), entry.get("resourceClaimName"),
                          entry.get("resourceClaimTemplateName"))
                 for entry in spec.get("resourceClaims") or ())


def claim_statuses(status: Mapping[str, Any]) -> tuple[tuple[str, str | None], ...]:
    """``status.resourceClaimStatuses`` as (pod claim name, ResourceClaim name) pairs."""
    return tuple((str(entry.get("name", "")), entry.get("resourceClaimName"))
                 for entry in status.get("resourceClaimStatuses") or ())


def claim_path(namespace: str, name: str) -> str:
    return f"{CLAIMS.format(namespace=namespace)}/{name}"


def needed(namespace: str, pod: str, refs: Sequence[ClaimRef],
           statuses: Sequence[tuple[str, str | None]]) -> tuple[list[tuple[str, bool]], str]:
    """The claims the pod needs, each with whether it must be the pod's own (made from a
    template), or why they cannot be known yet (the kubelet's message)."""
    created = dict(statuses)
    wanted: list[tuple[str, bool]] = []
    for ref in refs:
        if ref.claim is not None:
            wanted.append((ref.claim, False))
        elif ref.template is not None:
            if ref.name not in created:
                return [], f'pod "{namespace}/{pod}": ResourceClaim not created yet'
            name = created[ref.name]
            if name:
                wanted.append((name, True))
        else:
            return [], (f'pod "{namespace}/{pod}", spec.resourceClaim "{ref.name}": none of '
                        f'the supported fields are set')
    return wanted, ""


def refusal(namespace: str, pod: str, uid: str, name: str, claim: Mapping[str, Any], *,
            owned: bool) -> str:
    """Why ``claim`` cannot be used by the pod yet ("": it can), as the kubelet says it."""
    metadata = claim.get("metadata") or {}
    if owned and not any(ref.get("uid") == uid and ref.get("controller")
                         for ref in metadata.get("ownerReferences") or ()):
        return (f"ResourceClaim {namespace}/{name} was not created for Pod {namespace}/{pod} "
                f"(Pod is not owner)")
    reserved = (claim.get("status") or {}).get("reservedFor") or ()
    if not any(entry.get("uid") == uid for entry in reserved):
        return (f"pod {pod} ({uid}) is not allowed to use ResourceClaim {name} "
                f"({metadata.get('uid', '')})")
    return ""


def not_found(name: str) -> str:
    return f'fetch ResourceClaim {name}: resourceclaims.resource.k8s.io "{name}" not found'


def event_message(problem: str) -> str:
    return f"Failed to prepare dynamic resources: prepare dynamic resources: {problem}"
