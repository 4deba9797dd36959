"""gang_scheduling: Kueue admits a gang Job all at once and it completes; a gang that cannot fit
the queue's quota is never admitted, not even in part, and none of its pods ever exists.

Two Jobs on one ClusterQueue with a quota of 2 GPUs: ``gang-fits`` (2 pods of 1 GPU) and
``gang-too-big`` (3 pods of 1 GPU), the one that cannot fit submitted first.
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
    require_gpus,
)

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
QUOTA = 2
FITS, TOO_BIG = ("gang-fits", QUOTA), ("gang-too-big", QUOTA + 1)
#: How long the gang that cannot fit is watched after the other completed (Kueue tries
#: again every time quota is freed; a few of its passes).
SETTLE = 10.0


def job(name: str, pods: int, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"parallelism": pods, "completions": pods, "suspend": True, "template": {
            "metadata": {"annotations": {"fakefleet.dev/run-time": "5s"}},
            "spec": {"restartPolicy": "Never", "tolerations": [GPU_TOLERATION],
                     "containers": [{"name": "train", "image": "pytorch",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def admitted(workload: dict[str, Any]) -> bool:
    return any(c.get("type") in ("QuotaReserved", "Admitted") and c.get("status") == "True"
               for c in (workload.get("status") or {}).get("conditions") or [])


async def check(ctx: Context) -> Verdict:
    await addon_ready(ctx, "kueue", "KueueReady",
                      "set spec.addons.kueue: {} (or run 'fakefleet kueue install')")
    await require_gpus(ctx)
    ns = namespace(ctx, "gang_scheduling")
    await make_namespace(ctx, ns)
    queue = f"ffc-{ctx.run}"
    await ctx.member.create(f"{KUEUE}/resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": queue}})
    ctx.created(f"{KUEUE}/resourceflavors/{queue}")
    await ctx.member.create(f"{KUEUE}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": queue},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [{
                     "name": queue, "resources": [{"name": "nvidia.com/gpu",
                                                   "nominalQuota": str(QUOTA)}]}]}]}})
    ctx.created(f"{KUEUE}/clusterqueues/{queue}")
    await ctx.member.create(f"{KUEUE}/namespaces/{ns}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": queue, "namespace": ns}, "spec": {"clusterQueue": queue}})

    async def active() -> bool:
        found = await ctx.member.get(f"{KUEUE}/clusterqueues/{queue}")
        return any(c["type"] == "Active" and c["status"] == "True"
                   for c in (found.get("status") or {}).get("conditions") or [])
    await ctx.until(f"waiting for ClusterQueue {queue} Active", active)
    for name, count in (TOO_BIG, FITS):
        await ctx.member.create(f"/apis/batch/v1/namespaces/{ns}/jobs", job(name, count, queue))

    async def state() -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
        workloads = (await ctx.member.get(f"{KUEUE}/namespaces/{ns}/workloads"))["items"]
        by_job = {w["metadata"]["ownerReferences"][0]["name"]: w for w in workloads
                  if w["metadata"].get("ownerReferences")}
        pods = (await ctx.member.get(f"/api/v1/namespaces/{ns}/pods"))["items"]
        jobs = {j["metadata"]["name"]: j for j in
                (await ctx.member.get(f"/apis/batch/v1/namespaces/{ns}/jobs"))["items"]}
        return by_job, jobs, pods

    async def record() -> None:
        by_job, jobs, pods = await state()
        ctx.evidence.write("workloads.yaml", by_job)
        ctx.evidence.write("jobs.yaml", jobs)
        ctx.evidence.write("pods.yaml", pods)

    def never_partly(by_job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        mine = [p for p in pods if p["metadata"].get("labels", {}).get("job-name") == TOO_BIG[0]]
        if mine or admitted(by_job.get(TOO_BIG[0], {})):
            raise Unmet(f"the gang {TOO_BIG[0]} ({TOO_BIG[1]} GPUs against a quota of {QUOTA}) "
                        f"was admitted or got pods ({len(mine)}): gang scheduling is not "
                        f"all-or-nothing")

    async def fits_done() -> bool:
        by_job, jobs, pods = await state()
        never_partly(by_job, pods)
        return int((jobs.get(FITS[0], {}).get("status") or {}).get("succeeded") or 0) == FITS[1]

    try:
        await ctx.until(f"waiting for Job {FITS[0]} ({FITS[1]} pods) admitted by Kueue and "
                        f"complete", fits_done)
        settled = ctx.clock.now() + SETTLE
        ctx.at(f"watching {TOO_BIG[0]} stay unadmitted for {SETTLE:.0f}s")
        while ctx.clock.now() < settled:
            by_job, _, pods = await state()
            never_partly(by_job, pods)
            await ctx.clock.sleep(1.0)
    finally:
        await record()
    by_job, _, _ = await state()
    waiting = next((c.get("message", "") for c in (by_job.get(TOO_BIG[0], {}).get("status")
                                                     or {}).get("conditions") or []
                    if c.get("type") == "QuotaReserved"), "")
    return Verdict("Implemented",
                   f"Kueue admitted the gang {FITS[0]} ({FITS[1]} pods of 1 GPU, quota "
                   f"{QUOTA}) whole and it completed; {TOO_BIG[0]} ({TOO_BIG[1]} pods) was "
                   f"never admitted and got no pod (Kueue: {waiting or 'pending'})")
