"""Which ResourceClaims a pod needs and whether each lets it start (pure)."""

from __future__ import annotations

from operators.engine import claims
from operators.engine.claims import ClaimRef


def test_claims_are_named_directly_or_by_the_pod_s_status() -> None:
    refs = claims.claim_refs({"resourceClaims": [
        {"name": "a", "resourceClaimName": "shared"},
        {"name": "b", "resourceClaimTemplateName": "t"},
        {"name": "c", "resourceClaimTemplateName": "t"}]})
    statuses = claims.claim_statuses({"resourceClaimStatuses": [
        {"name": "b", "resourceClaimName": "p-b-1"}, {"name": "c"}]})
    # c's claim was not needed (no name): nothing to prepare for it.
    assert claims.needed("ns", "p", refs, statuses) == ([("shared", False), ("p-b-1", True)], "")


def test_a_template_s_claim_not_made_yet_or_an_unknown_reference_waits() -> None:
    assert claims.needed("ns", "p", [ClaimRef("b", None, "t")], []) == (
        [], 'pod "ns/p": ResourceClaim not created yet')
    assert claims.needed("ns", "p", [ClaimRef("x", None, None)], [])[1] == (
        'pod "ns/p", spec.resourceClaim "x": none of the supported fields are set')


def test_a_claim_lets_the_pod_start_once_reserved_for_it_and_owned_if_made_for_it() -> None:
    reserved = {"metadata": {"uid": "c1", "ownerReferences": [
        {"kind": "Pod", "uid": "u1", "controller": True}]},
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]}}
    assert claims.refusal("ns", "p", "u1", "c", reserved, owned=True) == ""
    assert claims.refusal("ns", "p", "u2", "c", reserved, owned=False) == (
        "pod p (u2) is not allowed to use ResourceClaim c (c1)")
    assert "(Pod is not owner)" in claims.refusal("ns", "p", "u2", "c", reserved, owned=True)
    assert claims.refusal("ns", "p", "u1", "c", {"metadata": {"uid": "c1"}}, owned=False) == (
        "pod p (u1) is not allowed to use ResourceClaim c (c1)")
