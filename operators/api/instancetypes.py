"""The machines fakefleet offers a cloud provider (Karpenter's KWOK provider), by name: one per
GPU preset and GPU count, and a few CPU-only ones. Pure data.

Both sides read this one table: the Karpenter add-on writes it as Karpenter's instance types
(:mod:`operators.addons.karpenter.rendering`), and the engine gives each node Karpenter makes
the real size of its type as ``status.capacity`` (:mod:`operators.engine.nodes`): Karpenter
itself writes there only what the pods it packed on the node request.

A GPU machine has :data:`CPU_PER_GPU` cores and :data:`MEMORY_PER_GI_GPU` GiB of memory per GPU
(an 8-GPU H100 machine: 192 cores, 1920 GiB, as a DGX H100 roughly has), and ``nvidia.com/gpu``
as the device plugin counts it. Prices are made up, in dollars per hour, ordered as the
clouds' are (per GPU: B200 and GB200 above H200 above H100 above A100): Karpenter launches the
cheapest type that fits, so they decide which size it picks when a NodePool allows several.
Every quantity is written in the form the API server gives back (``1920Gi``, ``8Ti``), so what
the engine wrote compares equal to what it reads.
"""

from __future__ import annotations

import dataclasses

from operators.api.gpus import PRESETS

#: GPUs per machine a preset comes with (a provisioner pool's ``gpu.count`` is one of these).
GPU_COUNTS = (1, 2, 4, 8)
CPU_PER_GPU = 24
MEMORY_PER_GI_GPU = 240
STORAGE_PER_TI_GPU = 1
#: Dollars per GPU-hour, per preset.
GPU_PRICES = {"A100-SXM4-80GB": 4.1, "H100-SXM5-80GB": 12.3, "H200-SXM-141GB": 13.8,
              "B200": 14.2, "GB200": 16.5}
#: Cores of the CPU-only machines; memory is 4 GiB per core.
CPU_SIZES = (4, 16, 64)
CPU_PRICE = 0.05  # per core-hour
PODS = "110"


@dataclasses.dataclass(frozen=True)
class InstanceType:
    """One machine: its name (``node.kubernetes.io/instance-type``), its size and price."""

    name: str
    resources: dict[str, str]
    price: float
    preset: str = ""
    """The GPU preset (operators.api.gpus) of its GPUs, "" for a CPU-only machine."""
    gpus: int = 0


def gpu_type_name(preset: str, count: int) -> str:
    """``h100-sxm5-80gb-8gpu``: Karpenter takes the part before the first '-' as the family."""
    return f"{preset.lower()}-{count}gpu"


def cpu_type_name(cores: int) -> str:
    return f"cpu-{cores}"


def _gpu_type(preset: str, count: int) -> InstanceType:
    return InstanceType(
        name=gpu_type_name(preset, count),
        resources={"cpu": str(CPU_PER_GPU * count),
                   "memory": _gibibytes(MEMORY_PER_GI_GPU * count),
                   "ephemeral-storage": f"{STORAGE_PER_TI_GPU * count}Ti",
                   "pods": PODS, "nvidia.com/gpu": str(count)},
        price=round(GPU_PRICES[preset] * count, 2), preset=preset, gpus=count)


def _cpu_type(cores: int) -> InstanceType:
    return InstanceType(
        name=cpu_type_name(cores),
        resources={"cpu": str(cores), "memory": _gibibytes(4 * cores),
                   "ephemeral-storage": "100Gi", "pods": PODS},
        price=round(CPU_PRICE * cores, 2))


def _gibibytes(count: int) -> str:
    """``count`` GiB as the API server writes it back (``1024Gi`` comes back ``1Ti``)."""
    return f"{count // 1024}Ti" if count % 1024 == 0 else f"{count}Gi"


#: Every type, GPU machines first, in a stable order.
CATALOGUE: tuple[InstanceType, ...] = (
    *(_gpu_type(preset, count) for preset in PRESETS for count in GPU_COUNTS),
    *(_cpu_type(cores) for cores in CPU_SIZES),
)
BY_NAME = {instance_type.name: instance_type for instance_type in CATALOGUE}


def cpu_types() -> tuple[InstanceType, ...]:
    return tuple(instance_type for instance_type in CATALOGUE if not instance_type.preset)
