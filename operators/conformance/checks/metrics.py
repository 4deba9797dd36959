"""accelerator_metrics and ai_service_metrics.

accelerator_metrics reads the cluster's DCGM endpoint from this host, as upstream's test reads
its ``-metrics-endpoint`` (the FakeCluster's status.dcgmEndpoint, or ``--metrics-endpoint``):
fake pods cannot fetch a URL, and the endpoint is on this host's loopback. It must carry
dcgm-exporter's utilization, framebuffer memory, power and temperature for every GPU of the
member's GPU nodes.

ai_service_metrics runs a serving workload whose pods expose vLLM's queue metric and opt in
to scraping as pods do (``prometheus.io/scrape: "true"``), and reads the metric back from what
the monitoring system collected, through ``custom.metrics.k8s.io``.
"""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from operators.conformance.checking import (
    Context,
    Unmet,
    Verdict,
    addon_ready,
    gpus,
    make_namespace,
    namespace,
    require_gpus,
)
from operators.k8s.errors import K8sError

DCGM_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
                "DCGM_FI_DEV_GPU_TEMP")
#: A metrics page larger than this is not read (thousands of GPUs fit well under it).
MAX_PAGE = 64 * 1024 * 1024
FETCH_TIMEOUT = 10.0


def fetch(url: str) -> str:
    """The page at ``url``, at most MAX_PAGE bytes (run in a thread: it blocks)."""
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as response:
        return str(response.read(MAX_PAGE).decode(errors="replace"))


def samples(text: str, names: tuple[str, ...]) -> dict[str, list[tuple[dict[str, str], str]]]:
    """Prometheus text format: each named metric's samples as (labels, value)."""
    found: dict[str, list[tuple[dict[str, str], str]]] = {name: [] for name in names}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        if name not in found:
            continue
        labels: dict[str, str] = {}
        for pair in rest.rstrip("}").split('",'):
            key, _, raw = pair.partition('="')
            if key:
                labels[key.strip(",")] = raw.rstrip('"')
        found[name].append((labels, value))
    return found


async def accelerators(ctx: Context) -> Verdict:
    nodes = await require_gpus(ctx)
    url = ctx.metrics_endpoint or (ctx.cluster.get("status") or {}).get("dcgmEndpoint", "")
    if not url:
        raise Unmet(f"FakeCluster {ctx.name} has no status.dcgmEndpoint (its engine publishes "
                    f"it once it runs), and no --metrics-endpoint was given")
    gpu_nodes = {n["metadata"]["name"]: int(n["status"]["allocatable"]["nvidia.com/gpu"])
                 for n in nodes if gpus([n])}
    if not gpu_nodes:
        raise Unmet(f"FakeCluster {ctx.name} has no GPU node right now (its pools make them "
                    f"only for pods that wait): the DCGM endpoint has no GPU to show")
    ctx.at(f"reading DCGM metrics at {url}")
    try:
        text = await asyncio.to_thread(fetch, url)
    except OSError as error:
        raise Unmet(f"the DCGM endpoint {url} did not answer: {error}") from error
    found = samples(text, DCGM_METRICS)
    ctx.evidence.write("endpoint.txt", url + "\n")
    ctx.evidence.write("dcgm-samples.txt", "\n".join(
        line for line in text.splitlines()
        if line.split("{")[0].split(" ")[0] in DCGM_METRICS or
        any(line.startswith(f"# {kind} {name}") for kind in ("HELP", "TYPE")
            for name in DCGM_METRICS)) + "\n")
    missing = []
    for name in DCGM_METRICS:
        seen = {(labels.get("Hostname", ""), labels.get("gpu", "")) for labels, _ in found[name]}
        for node, count in gpu_nodes.items():
            lacking = [str(i) for i in range(count) if (node, str(i)) not in seen]
            if lacking:
                missing.append(f"{name} of {node} GPU {','.join(lacking)}")
    if missing:
        raise Unmet(f"the DCGM endpoint {url} lacks {len(missing)} series: "
                    f"{'; '.join(missing[:5])}")
    total = sum(gpu_nodes.values())
    return Verdict("Implemented",
                   f"{', '.join(DCGM_METRICS)} served per GPU (dcgm-exporter's names and "
                   f"labels) for all {total} GPUs of {len(gpu_nodes)} GPU nodes, read from "
                   f"{url}")


METRIC = "vllm_num_requests_waiting"
CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"


def serving(name: str, value: str, *, gpu: bool, replicas: int = 1) -> dict[str, Any]:
    """An inference Deployment whose pods report ``METRIC`` as ``value``."""
    resources = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {
                     "metadata": {"labels": {"app": name}, "annotations": {
                         "prometheus.io/scrape": "true",
                         f"fakefleet.dev/metric.{METRIC}": value}},
                     "spec": {"tolerations": [{"operator": "Exists"}],
                              "terminationGracePeriodSeconds": 0,
                              "containers": [{"name": "vllm", "image": "vllm/vllm-openai",
                                              "resources": resources}]}}}}


async def services(ctx: Context) -> Verdict:
    await addon_ready(ctx, "customMetrics", "PrometheusReady",
                      "set spec.addons.customMetrics: {}")
    await addon_ready(ctx, "customMetrics", "CustomMetricsReady",
                      "set spec.addons.customMetrics: {}")
    ns = namespace(ctx, "ai_service_metrics")
    await make_namespace(ctx, ns)
    await ctx.member.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                            serving("inference", "7", gpu=False))

    async def collected() -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await ctx.member.get(
                f"{CUSTOM}/namespaces/{ns}/pods/*/{METRIC}")
        except K8sError:  # not served yet (the adapter's APIService comes up): look again
            return None
        items = [i for i in found.get("items") or [] if str(i.get("value")) == "7"]
        return found if items else None
    found = await ctx.until(f"waiting for {METRIC} of the pods of {ns}/inference, collected "
                            f"by Prometheus, in custom.metrics.k8s.io", collected)
    ctx.evidence.write("custom-metrics.yaml", found)
    pod = found["items"][0]["describedObject"]["name"]
    return Verdict("Implemented",
                   f"Prometheus discovered the serving pod {ns}/{pod} by its "
                   f"prometheus.io/scrape annotation and collected {METRIC} from its "
                   f"Prometheus-format endpoint; read back through custom.metrics.k8s.io")
