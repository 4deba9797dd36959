"""GPU telemetry in dcgm-exporter's metric names and labels, one endpoint for a whole member
cluster: what NVIDIA's exporter would show on every GPU node, concatenated.

Per GPU: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE``
(MiB), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_GPU_TEMP`` (°C), ``DCGM_FI_DEV_SM_CLOCK``
(MHz) and ``DCGM_FI_DEV_XID_ERRORS`` (the last Xid the driver reported, 0 for none), labelled
``gpu`` (index), ``UUID``, ``device`` (``nvidiaN``), ``modelName`` (the NVML name),
``Hostname`` (the node) and, for a GPU a pod holds, ``namespace``, ``pod`` and ``container``,
as dcgm-exporter adds them from the kubelet's pod-resources API.

Readings follow from utilisation: power and temperature rise linearly from the product's idle
figures to its busy ones, the SM clock is the idle clock until the GPU works, then its maximum;
a fault can pin temperature or clock (a thermal slowdown), and a GPU out of service (a fatal
Xid) does no work. The figures per product are typical of their datasheets (TDP, max clocks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from operators.metrics.text import family, labels


@dataclasses.dataclass(frozen=True)
class Telemetry:
    """How one GPU product reads, idle and busy."""

    model_name: str  # NVML's name, as dcgm-exporter's modelName label shows it
    idle_watts: float
    max_watts: float
    idle_clock: int  # MHz
    max_clock: int
    idle_temperature: float  # °C
    busy_temperature: float


#: By GPU preset name (:data:`operators.api.gpus.PRESETS`).
PRODUCTS: dict[str, Telemetry] = {
    "A100-SXM4-80GB": Telemetry("NVIDIA A100-SXM4-80GB", 60, 400, 210, 1410, 32, 65),
    "H100-SXM5-80GB": Telemetry("NVIDIA H100 80GB HBM3", 70, 700, 345, 1980, 34, 70),
    "H200-SXM-141GB": Telemetry("NVIDIA H200", 75, 700, 345, 1980, 34, 70),
    "B200": Telemetry("NVIDIA B200", 120, 1000, 600, 1965, 35, 75),
    "GB200": Telemetry("NVIDIA GB200", 130, 1200, 600, 2062, 35, 75),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Holder:
    """The pod (and its container) a GPU is allocated to."""

    namespace: str
    pod: str
    container: str


@dataclasses.dataclass(frozen=True, slots=True)
class GPUSample:
    """One GPU's state at a scrape; the readings follow from it."""

    node: str
    index: int
    uuid: str
    product: str  # a preset name
    memory_mib: int
    utilization: float = 0.0  # percent
    memory_used: float = 0.0  # percent of memory_mib
    holder: Holder | None = None
    xid: int = 0
    healthy: bool = True
    temperature: float | None = None  # a fault's reading, else from utilisation
    sm_clock: int | None = None


FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered."),
)


def readings(gpu: GPUSample) -> tuple[float, ...]:
    """The GPU's values, in the order of :data:`FIELDS`."""
    product = PRODUCTS[gpu.product]
    busy = min(max(gpu.utilization, 0.0), 100.0) / 100 if gpu.healthy else 0.0
    used = round(gpu.memory_mib * min(max(gpu.memory_used, 0.0), 100.0) / 100) \
        if gpu.healthy else 0
    clock = gpu.sm_clock if gpu.sm_clock is not None else (
        product.max_clock if busy > 0 else product.idle_clock)
    temperature = gpu.temperature if gpu.temperature is not None else round(
        product.idle_temperature + (product.busy_temperature - product.idle_temperature) * busy)
    power = round(product.idle_watts + (product.max_watts - product.idle_watts) * busy, 3)
    return (clock, temperature, power, round(busy * 100), gpu.memory_mib - used, used, gpu.xid)


def gpu_labels(gpu: GPUSample) -> str:
    pairs = [("gpu", str(gpu.index)), ("UUID", gpu.uuid), ("device", f"nvidia{gpu.index}"),
             ("modelName", PRODUCTS[gpu.product].model_name), ("Hostname", gpu.node)]
    if gpu.holder is not None:
        pairs += [("container", gpu.holder.container), ("namespace", gpu.holder.namespace),
                  ("pod", gpu.holder.pod)]
    return labels(pairs)


def render(gpus: Iterable[GPUSample]) -> str:
    """The exporter's ``/metrics`` text for ``gpus``."""
    rows = [(gpu_labels(gpu), readings(gpu)) for gpu in gpus]
    lines: list[str] = []
    for position, (name, help_text) in enumerate(FIELDS):
        lines += family(name, "gauge", help_text,
                        [(rendered, values[position]) for rendered, values in rows])
    return "\n".join(lines) + "\n"
