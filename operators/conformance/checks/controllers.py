"""robust_controller: KubeRay's ray-operator as an add-on (spec.addons.kuberay, its
``KubeRayReady`` condition): its CRDs Established, its validating webhook configured and
refusing an invalid RayCluster in its own words, and a RayCluster going ready on fake nodes,
scaling its workers and being deleted.

A RayJob is not checked: it completes only after its submitter reads the Ray dashboard at the
head Service's cluster DNS name, which nothing serves in a simulation.
"""

from __future__ import annotations

from typing import Any

from operators.conformance.checking import (
    Context,
    Unmet,
    Verdict,
    addon_ready,
    make_namespace,
    namespace,
    running,
)
from operators.k8s.errors import K8sError

CRDS = ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io")
RAY = "/apis/ray.io/v1"
NAME = "raycluster"
WEBHOOK = "kuberay-validating-webhook-configuration"
#: The webhook's own words (the CRD's schema has no such rule): the refusal is the webhook's.
REFUSAL = "worker group names must be unique"
NOT_CHECKED = ("A RayJob is not checked: its submitter reads the Ray dashboard at the head "
               "Service's cluster DNS name, which nothing serves in a simulation.")


def raycluster(name: str, workers: int, *, groups: tuple[str, ...] = ("workers",)) -> dict[
        str, Any]:
    def pod(role: str) -> dict[str, Any]:
        return {"spec": {"tolerations": [{"operator": "Exists"}], "containers": [
            {"name": f"ray-{role}", "image": "rayproject/ray:2.46.0",
             "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": pod("head")},
                     "workerGroupSpecs": [
                         {"groupName": group, "replicas": workers, "minReplicas": 0,
                          "maxReplicas": 8, "rayStartParams": {}, "template": pod("worker")}
                         for group in groups]}}


async def check(ctx: Context) -> Verdict:
    await addon_ready(ctx, "kuberay", "KubeRayReady", "set spec.addons.kuberay: {}")
    ctx.at("reading KubeRay's CRDs")
    crds = []
    for crd in CRDS:
        found = await ctx.member.get(
            f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
        if not any(c["type"] == "Established" and c["status"] == "True"
                   for c in found["status"].get("conditions") or []):
            raise Unmet(f"KubeRay's CRD {crd} is not Established")
        crds.append(crd)
    ctx.evidence.write("crds.yaml", crds)
    ns = namespace(ctx, "robust_controller")
    await make_namespace(ctx, ns)
    clusters = f"{RAY}/namespaces/{ns}/rayclusters"
    ctx.at(f"reading KubeRay's ValidatingWebhookConfiguration {WEBHOOK}")
    hook = await ctx.member.get("/apis/admissionregistration.k8s.io/v1/"
                                f"validatingwebhookconfigurations/{WEBHOOK}")
    ctx.evidence.write("webhook.yaml", hook)
    ctx.at("creating a RayCluster with two worker groups of one name, for the webhook to refuse")
    try:
        await ctx.member.create(clusters, raycluster("invalid", 1, groups=("same", "same")))
    except K8sError as error:
        refusal = str(error)
    else:
        raise Unmet("KubeRay's webhook admitted a RayCluster with two worker groups named "
                    "'same'")
    ctx.evidence.write("webhook-refusal.txt", refusal + "\n")
    if REFUSAL not in refusal:
        raise Unmet(f"the invalid RayCluster was refused, but not with KubeRay's webhook's "
                    f"words ({REFUSAL!r}): {refusal}")
    await ctx.member.create(clusters, raycluster(NAME, 1))
    path = f"{clusters}/{NAME}"

    def workers(count: int) -> Any:
        async def probe() -> bool:
            found = (await ctx.member.get(f"/api/v1/namespaces/{ns}/pods", {
                "labelSelector": f"ray.io/cluster={NAME},ray.io/node-type=worker"}))["items"]
            up = [p for p in found if running(p) and not p["metadata"].get("deletionTimestamp")]
            return len(up) == count == len(found)
        return probe

    async def ready() -> bool:
        found = await ctx.member.get(path)
        return (found.get("status") or {}).get("state") == "ready"
    try:
        await ctx.until(f"waiting for RayCluster {ns}/{NAME} ready", ready)
        await ctx.member.patch(path, [{"op": "replace",
                                       "path": "/spec/workerGroupSpecs/0/replicas", "value": 2}],
                               content_type="application/json-patch+json")
        await ctx.until("waiting for the RayCluster's 2 workers to run", workers(2))
    finally:
        ctx.evidence.write("raycluster.yaml", await ctx.member.get(path))
    await ctx.member.delete(path)

    async def gone() -> bool:
        return not (await ctx.member.get(f"/api/v1/namespaces/{ns}/pods", {
            "labelSelector": f"ray.io/cluster={NAME}"}))["items"]
    await ctx.until("waiting for the RayCluster's pods to go with it", gone)
    return Verdict("Implemented",
                   f"KubeRay's CRDs Established, its webhook refused an invalid RayCluster, a "
                   f"RayCluster went ready, scaled to 2 workers and was deleted with its pods. "
                   f"{NOT_CHECKED}")
