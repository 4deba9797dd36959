"""The kubelet's resource metrics and dcgm-exporter's GPU metrics as the engine renders them,
read back with a real Prometheus text parser (prometheus_client's). Pure."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from operators.api.gpus import PRESETS, gpu_uuid
from operators.metrics import dcgm, kubelet
from operators.metrics.dcgm import GPUSample, Holder
from operators.metrics.kubelet import ContainerSample, NodeSample, PodSample


def parsed(text: str) -> dict[str, Any]:
    """Family name → (type, [(sample name, labels, value, timestamp)])."""
    return {family.name: (family.type, [(s.name, s.labels, s.value, s.timestamp)
                                        for s in family.samples])
            for family in text_string_to_metric_families(text)}


NODE = NodeSample(
    timestamp=1_800_000_000_123, cpu_seconds=3600.5, memory_bytes=2.5 * 2 ** 30,
    pods=[PodSample("shop", "web-1", (ContainerSample("app", 12.25, 2 ** 28, 1_799_999_000.0),
                                      ContainerSample("proxy", 0.75, 2 ** 24, 1_799_999_000.0))),
          PodSample("batch", "idle", (ContainerSample("main", 0.0, 0.0, 1_799_999_990.5),))])


def test_resource_metrics_parse_back_with_their_kubelet_names_types_and_times() -> None:
    families = parsed(kubelet.render(NODE))
    assert set(families) == {
        "container_cpu_usage_seconds", "container_memory_working_set_bytes",
        "container_start_time_seconds", "node_cpu_usage_seconds",
        "node_memory_working_set_bytes", "pod_cpu_usage_seconds",
        "pod_memory_working_set_bytes", "resource_scrape_error"}
    kind, samples = families["container_cpu_usage_seconds"]
    assert kind == "counter"
    assert samples[0] == ("container_cpu_usage_seconds_total",
                          {"container": "app", "namespace": "shop", "pod": "web-1"}, 12.25,
                          1_800_000_000.123)
    _, nodes = families["node_cpu_usage_seconds"]
    assert nodes == [("node_cpu_usage_seconds_total", {}, 3600.5, 1_800_000_000.123)]
    _, pods = families["pod_cpu_usage_seconds"]
    assert pods[0][1:3] == ({"namespace": "shop", "pod": "web-1"}, 13.0), "its containers' sum"
    kind, memory = families["pod_memory_working_set_bytes"]
    assert kind == "gauge"
    assert memory[0][2] == 2 ** 28 + 2 ** 24
    _, starts = families["container_start_time_seconds"]
    assert [s[2] for s in starts] == [1_799_999_000.0, 1_799_999_000.0, 1_799_999_990.5]
    assert families["resource_scrape_error"][1][0][2] == 0


def test_a_usage_of_zero_reads_as_the_least_metrics_server_keeps() -> None:
    """metrics-server drops a container whose counter or memory reads 0 (the whole pod)."""
    families = parsed(kubelet.render(NODE))
    idle = [s for s in families["container_cpu_usage_seconds"][1] if s[1]["pod"] == "idle"]
    assert idle[0][2] == kubelet.LEAST_CPU_SECONDS
    memory = [s for s in families["container_memory_working_set_bytes"][1]
              if s[1]["pod"] == "idle"]
    assert memory[0][2] == kubelet.LEAST_BYTES


def test_a_node_without_pods_still_reports_itself() -> None:
    families = parsed(kubelet.render(NodeSample(1000, 1.0, 1e9, [])))
    assert families["container_cpu_usage_seconds"][1] == []
    assert families["node_memory_working_set_bytes"][1][0][2] == 1e9


GPUS = [
    GPUSample("h100-0", 0, gpu_uuid("default.west", "h100-0", 0), "H100-SXM5-80GB", 81559,
              utilization=90.0, memory_used=50.0,
              holder=Holder("ml", "train-0", "trainer")),
    GPUSample("h100-0", 1, gpu_uuid("default.west", "h100-0", 1), "H100-SXM5-80GB", 81559),
    GPUSample("h100-0", 2, gpu_uuid("default.west", "h100-0", 2), "H100-SXM5-80GB", 81559,
              utilization=90.0, xid=79, healthy=False,
              holder=Holder("ml", "train-1", "trainer")),
    GPUSample("h100-1", 0, gpu_uuid("default.west", "h100-1", 0), "H100-SXM5-80GB", 81559,
              temperature=92, sm_clock=990),
]


def test_dcgm_metrics_carry_dcgm_exporter_names_and_labels() -> None:
    families = parsed(dcgm.render(GPUS))
    assert set(families) == {name for name, _ in dcgm.FIELDS}
    assert all(kind == "gauge" for kind, _ in families.values())
    util = families["DCGM_FI_DEV_GPU_UTIL"][1]
    busy = util[0][1]
    assert busy == {"gpu": "0", "UUID": gpu_uuid("default.west", "h100-0", 0),
                    "device": "nvidia0", "modelName": "NVIDIA H100 80GB HBM3",
                    "Hostname": "h100-0", "namespace": "ml", "pod": "train-0",
                    "container": "trainer"}
    assert util[1][1] == {"gpu": "1", "UUID": gpu_uuid("default.west", "h100-0", 1),
                          "device": "nvidia1", "modelName": "NVIDIA H100 80GB HBM3",
                          "Hostname": "h100-0"}, "a GPU nobody holds has no pod labels"
    assert [s[2] for s in util] == [90, 0, 0, 0], "a GPU out of service does no work"


def test_dcgm_readings_follow_utilisation_faults_and_memory() -> None:
    families = parsed(dcgm.render(GPUS))

    def values(name: str) -> list[float]:
        return [s[2] for s in families[name][1]]

    h100 = dcgm.PRODUCTS["H100-SXM5-80GB"]
    assert values("DCGM_FI_DEV_FB_USED") == [round(81559 / 2), 0, 0, 0]
    assert values("DCGM_FI_DEV_FB_FREE") == [81559 - round(81559 / 2), 81559, 81559, 81559]
    power = values("DCGM_FI_DEV_POWER_USAGE")
    assert power[1] == h100.idle_watts
    assert power[0] == round(h100.idle_watts + 0.9 * (h100.max_watts - h100.idle_watts), 3)
    clocks = values("DCGM_FI_DEV_SM_CLOCK")
    assert clocks[:3] == [h100.max_clock, h100.idle_clock, h100.idle_clock]
    assert clocks[3] == 990, "a thermal fault's clock"
    temperatures = values("DCGM_FI_DEV_GPU_TEMP")
    assert temperatures[1] == h100.idle_temperature
    assert h100.idle_temperature < temperatures[0] < h100.busy_temperature
    assert temperatures[3] == 92
    assert values("DCGM_FI_DEV_XID_ERRORS") == [0, 0, 79, 0]


def test_every_preset_has_telemetry() -> None:
    assert set(dcgm.PRODUCTS) == set(PRESETS)
