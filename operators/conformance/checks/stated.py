"""What fakefleet states rather than checks, and why: requirements a simulation cannot judge
honestly. None of them is ever Implemented on simulated evidence.

ai_inference is checked as far as a simulation can: whether the Gateway API is served. Its data
plane (traffic split, header routing) has no traffic to act on here, so the best it can be is
Partially Implemented.
"""

from __future__ import annotations

from operators.conformance.checking import Context, Unmet, Verdict
from operators.conformance.results import Status
from operators.k8s.errors import NotFound

GATEWAY = "/apis/gateway.networking.k8s.io"

#: Requirement → (status, why), for what no check can judge on simulated hardware.
STATED: dict[str, tuple[Status, str]] = {
    "driver_runtime_management": (
        "N/A", "fake nodes run no accelerator driver and no container runtime: fakefleet's "
               "engine plays the kubelet, so there is nothing installed to verify"),
    "gpu_sharing": (
        "Not Implemented", "fakefleet's GPU presets offer whole GPUs (nvidia.com/gpu or DRA "
                           "devices); no MIG partitions or time-slicing are simulated"),
    "virtualized_accelerator": (
        "N/A", "no hypervisor and no vGPU are simulated"),
    "advanced_inference_ingress": (
        "Not Implemented", "no Gateway API Inference Extension runs: fake pods serve no "
                           "requests for it to route"),
    "high_performance_networking": (
        "N/A", "no network fabric is simulated: fake pods have no network interfaces to "
               "attach, RDMA or otherwise"),
    "disaggregated_inference": (
        "Not Implemented", "no inference server runs in fake pods, so no prefill and decode "
                           "phases exist to disaggregate"),
    "secure_accelerator_access": (
        "Not Implemented", "device isolation inside containers needs containers and devices; "
                           "fake pods have neither, so isolation cannot be shown on simulated "
                           "hardware"),
}


async def ai_inference(ctx: Context) -> Verdict:
    ctx.at("looking for the Gateway API in the member's discovery")
    try:
        group = await ctx.member.get(GATEWAY)
    except NotFound:
        raise Unmet("the Gateway API (gateway.networking.k8s.io) is not served by the member: "
                    "install its CRDs; even then no Gateway data plane runs on simulated "
                    "nodes") from None
    versions = [v["version"] for v in group.get("versions") or []]
    ctx.evidence.write("gateway-api.yaml", group)
    return Verdict("Partially Implemented",
                   f"the Gateway API is served ({', '.join(versions)}), but no Gateway "
                   f"implementation's data plane runs on simulated nodes: weighted splitting "
                   f"and header routing cannot be shown")
