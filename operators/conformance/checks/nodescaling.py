"""cluster_autoscaling: Karpenter makes a GPU node for a pod that waits for one, and removes the
node once it is idle.

The pod asks for 1 GPU of a FakeNodePool with provisioner karpenter (its nodeSelector names the
pool, so no node that exists already takes it); the check waits for a new node with a kwok://
provider ID under it, deletes the pod, and waits for the node to go (consolidateAfter plus
Karpenter's own 30-40 s of polling and validation).
"""

from __future__ import annotations

from typing import Any

from operators.conformance.checking import (
    GPU_TOLERATION,
    Context,
    Unmet,
    Verdict,
    addon_ready,
    make_namespace,
    namespace,
    provisioner_gpu_pools,
    running,
)


async def check(ctx: Context) -> Verdict:
    await addon_ready(ctx, "karpenter", "KarpenterReady", "set spec.addons.karpenter: {} and "
                      "add a FakeNodePool with provisioner: karpenter and spec.gpu")
    pools = provisioner_gpu_pools(ctx.pools)
    if not pools:
        raise Unmet(f"FakeCluster {ctx.name} runs Karpenter but no FakeNodePool with "
                    f"provisioner: karpenter has spec.gpu: add one (e.g. gpu: {{preset: "
                    f"H100-SXM5-80GB}})")
    pool = pools[0]["metadata"]["name"]
    before = {n["metadata"]["name"] for n in (await ctx.member.get("/api/v1/nodes"))["items"]}
    ctx.evidence.write("nodes-before.yaml", sorted(before))
    ns = namespace(ctx, "cluster_autoscaling")
    await make_namespace(ctx, ns)
    await ctx.member.create(f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waits-for-a-gpu"},
        "spec": {"nodeSelector": {"karpenter.sh/nodepool": pool},
                 "tolerations": [GPU_TOLERATION],
                 "containers": [{"name": "train", "image": "pytorch",
                                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    pod_path = f"/api/v1/namespaces/{ns}/pods/waits-for-a-gpu"

    async def placed() -> dict[str, Any] | None:
        pod: dict[str, Any] = await ctx.member.get(pod_path)
        node = pod["spec"].get("nodeName")
        return pod if running(pod) and node and node not in before else None
    try:
        pod = await ctx.until(f"waiting for Karpenter to make a node of pool {pool} and the "
                              f"GPU pod to run on it", placed)
    finally:
        ctx.evidence.write("nodeclaims.yaml", (await ctx.member.get(
            "/apis/karpenter.sh/v1/nodeclaims"))["items"])
    node_name = pod["spec"]["nodeName"]
    node = await ctx.member.get(f"/api/v1/nodes/{node_name}")
    ctx.evidence.write("pod.yaml", pod)
    ctx.evidence.write("node.yaml", node)
    if not str(node["spec"].get("providerID", "")).startswith("kwok://"):
        raise Unmet(f"the pod ran on {node_name}, a node Karpenter did not make")
    await ctx.member.delete(pod_path, params={"gracePeriodSeconds": "0"})

    async def gone() -> bool:
        names = {n["metadata"]["name"] for n in (await ctx.member.get("/api/v1/nodes"))["items"]}
        return node_name not in names
    await ctx.until(f"waiting for Karpenter to remove the idle node {node_name}", gone)
    ctx.evidence.write("nodes-after.yaml", sorted(
        n["metadata"]["name"] for n in (await ctx.member.get("/api/v1/nodes"))["items"]))
    gpus = node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")
    kind = node["metadata"].get("labels", {}).get("node.kubernetes.io/instance-type", "?")
    return Verdict("Implemented",
                   f"Karpenter made node {node_name} ({kind}, {gpus} GPUs) of pool {pool} for "
                   f"a pending GPU pod, and removed it once idle")
