"""DRA, checked though v1.36 asks nothing of it (its dra_support went): resource.k8s.io/v1
served, fakefleet's DeviceClass there, GPUs published as ResourceSlices, and a ResourceClaim
allocated by the real scheduler to a pod that runs. Reported in junit.xml and the evidence
only, never in PRODUCT.yaml.
"""

from __future__ import annotations

from typing import Any

from operators.api.gpus import DEVICE_CLASS, DRA_DRIVER
from operators.conformance.checking import (
    Context,
    Unmet,
    Verdict,
    make_namespace,
    namespace,
    running,
)
from operators.k8s.errors import NotFound

ID = "dra_resource_claims"
RESOURCE = "/apis/resource.k8s.io/v1"


async def check(ctx: Context) -> Verdict:
    try:
        await ctx.member.get(f"{RESOURCE}/deviceclasses/{DEVICE_CLASS}")
    except NotFound:
        raise Unmet(f"no DeviceClass {DEVICE_CLASS} in the member: no FakeNodePool offers its "
                    f"GPUs through DRA (spec.gpu.allocation: dra or both)") from None
    slices = [s for s in (await ctx.member.get(f"{RESOURCE}/resourceslices"))["items"]
              if s["spec"].get("driver") == DRA_DRIVER]
    ctx.evidence.write("resourceslices.yaml", [
        {"node": s["spec"].get("nodeName"), "devices": len(s["spec"].get("devices") or [])}
        for s in slices])
    if not slices:
        raise Unmet(f"no ResourceSlice of driver {DRA_DRIVER}: no FakeNodePool offers its "
                    f"GPUs through DRA (spec.gpu.allocation: dra or both)")
    ns = namespace(ctx, "dra")
    await make_namespace(ctx, ns)
    await ctx.member.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS, "count": 1}}]}}})
    await ctx.member.create(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "claims-a-gpu"},
        "spec": {"tolerations": [{"operator": "Exists"}], "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
                 "containers": [{"name": "main", "image": "trainer",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})

    async def allocated() -> dict[str, Any] | None:
        pod: dict[str, Any] = await ctx.member.get(f"/api/v1/namespaces/{ns}/pods/claims-a-gpu")
        return pod if running(pod) else None
    try:
        pod = await ctx.until("waiting for the pod with a ResourceClaim to run", allocated)
    finally:
        claim = await ctx.member.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/one-gpu")
        ctx.evidence.write("resourceclaim.yaml", claim)
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
        "results") or []
    if not results:
        raise Unmet("the pod runs but its ResourceClaim shows no allocation")
    device = results[0]
    return Verdict("Implemented",
                   f"the scheduler allocated {device.get('pool')}/{device.get('device')} "
                   f"({DRA_DRIVER}) to a ResourceClaim, and its pod ran on "
                   f"{pod['spec']['nodeName']}; v1.36 asks nothing of DRA (dra_support was "
                   f"removed), so this is in junit.xml and the evidence only")
