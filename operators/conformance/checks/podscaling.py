"""pod_autoscaling: a HorizontalPodAutoscaler of type Pods scales GPU pods on an AI-serving
metric, vLLM's queue (``vllm_num_requests_waiting``), up and back down.

The pods report the metric from their ``fakefleet.dev/metric.<name>`` annotation (the engine
serves it, Prometheus scrapes it, the custom-metrics adapter serves it to the HPA controller).
The check raises it on the running pods to 30 (target: 10 per pod), waits for 2 replicas, lowers
it to 0 on every pod and waits for 1.
"""

from __future__ import annotations

from typing import Any

from operators.conformance.checking import (
    Context,
    Verdict,
    addon_ready,
    make_namespace,
    namespace,
    require_gpus,
    running,
)
from operators.conformance.checks.metrics import METRIC, serving

NAME = "inference"
MAX_REPLICAS = 2


def autoscaler() -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": NAME},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": NAME},
                 "minReplicas": 1, "maxReplicas": MAX_REPLICAS,
                 "metrics": [{"type": "Pods", "pods": {
                     "metric": {"name": METRIC},
                     "target": {"type": "AverageValue", "averageValue": "10"}}}],
                 "behavior": {
                     "scaleUp": {"stabilizationWindowSeconds": 0},
                     "scaleDown": {"stabilizationWindowSeconds": 0, "policies": [
                         {"type": "Percent", "value": 100, "periodSeconds": 1}]}}}}


async def check(ctx: Context) -> Verdict:
    await addon_ready(ctx, "customMetrics", "CustomMetricsReady",
                      "set spec.addons.customMetrics: {}")
    await require_gpus(ctx)
    ns = namespace(ctx, "pod_autoscaling")
    await make_namespace(ctx, ns)
    await ctx.member.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                            serving(NAME, "2", gpu=True))
    await ctx.member.create(f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers",
                            autoscaler())
    hpa_path = f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{NAME}"

    async def pods() -> list[dict[str, Any]]:
        return [p for p in (await ctx.member.get(
            f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"app={NAME}"}))["items"]
            if not p["metadata"].get("deletionTimestamp")]

    async def measured() -> bool:
        current = ((await ctx.member.get(hpa_path)).get("status") or {}).get(
            "currentMetrics") or []
        return any(m.get("pods", {}).get("metric", {}).get("name") == METRIC for m in current)

    async def annotate(value: str) -> None:
        for pod in await pods():
            await ctx.member.patch(
                f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
                {"metadata": {"annotations": {f"fakefleet.dev/metric.{METRIC}": value}}})

    def at(count: int) -> Any:
        async def probe() -> bool:
            found = await pods()
            return len(found) == count and all(running(p) for p in found)
        return probe

    try:
        await ctx.until("waiting for the GPU pod to run", at(1))
        await ctx.until(f"waiting for the HPA to measure {METRIC}", measured)
        await annotate("30")
        await ctx.until(f"waiting for the HPA to scale up to {MAX_REPLICAS} GPU pods on "
                        f"{METRIC} 30 (target 10 per pod)", at(MAX_REPLICAS))
        await annotate("0")
        await ctx.until(f"waiting for the HPA to scale back to 1 on {METRIC} 0", at(1))
    finally:
        ctx.evidence.write("hpa.yaml", await ctx.member.get(hpa_path))
        events = await ctx.member.get(f"/api/v1/namespaces/{ns}/events")
        ctx.evidence.write("events.yaml", [
            {"reason": e.get("reason"), "object": e["involvedObject"].get("name"),
             "message": e.get("message")} for e in events["items"]])
    return Verdict("Implemented",
                   f"an HPA of type Pods on {METRIC} (AverageValue 10) scaled a Deployment of "
                   f"GPU pods from 1 to {MAX_REPLICAS} when the pods reported 30 and back to 1 "
                   f"at 0, through Prometheus and the custom-metrics adapter")
