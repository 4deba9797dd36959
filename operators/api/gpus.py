"""GPU product presets: what a node of each product looks like to Kubernetes.

The labels follow NVIDIA GPU Feature Discovery (``nvidia.com/gpu.product`` and friends), the
capacity follows the device plugin (``nvidia.com/gpu`` = physical GPUs). Product strings are the
NVML names with spaces turned into dashes; where sources disagree (H200, B200, GB200) we use the
short form ``NVIDIA-H200``/``NVIDIA-B200``/``NVIDIA-GB200``. Memory is in MiB as NVML reports it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Literal

GPUPresetName = Literal["A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "B200", "GB200"]
#: How pods get a pool's GPUs: the device plugin's extended resource, DRA, or both.
GPUAllocation = Literal["extended", "dra", "both"]

#: The DRA driver fakefleet plays on GPU nodes, and the DeviceClass that selects its devices.
DRA_DRIVER = "gpu.fakefleet.dev"
DEVICE_CLASS = DRA_DRIVER

DEFAULT_DRIVER_VERSION = "570.133.20"
DEFAULT_CUDA_VERSION = "12.8"


@dataclasses.dataclass(frozen=True)
class GPUPreset:
    product: str
    memory_mib: int
    family: str
    compute: tuple[int, int]
    gpus_per_node: int
    machine: str
    nvlink_domain: bool = False


PRESETS: dict[str, GPUPreset] = {
    "A100-SXM4-80GB": GPUPreset("NVIDIA-A100-SXM4-80GB", 81920, "ampere", (8, 0), 8,
                                "DGXA100-920-23687-2530-000"),
    "H100-SXM5-80GB": GPUPreset("NVIDIA-H100-80GB-HBM3", 81559, "hopper", (9, 0), 8,
                                "DGXH100"),
    "H200-SXM-141GB": GPUPreset("NVIDIA-H200", 143771, "hopper", (9, 0), 8, "DGXH200"),
    "B200": GPUPreset("NVIDIA-B200", 183359, "blackwell", (10, 0), 8, "DGXB200"),
    "GB200": GPUPreset("NVIDIA-GB200", 189471, "blackwell", (10, 0), 4, "GB200-NVL72",
                       nvlink_domain=True),
}


def gfd_labels(
    preset_name: str,
    count: int,
    *,
    driver_version: str = DEFAULT_DRIVER_VERSION,
    cuda_version: str = DEFAULT_CUDA_VERSION,
    clique: str | None = None,
) -> dict[str, str]:
    """GPU Feature Discovery labels of a node with ``count`` GPUs of ``preset_name``."""
    preset = PRESETS[preset_name]
    major, minor, revision = ([*driver_version.split("."), "0", "0"])[:3]
    cuda_major, cuda_minor = ([*cuda_version.split("."), "0"])[:2]
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": preset.product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(preset.memory_mib),
        "nvidia.com/gpu.family": preset.family,
        "nvidia.com/gpu.compute.major": str(preset.compute[0]),
        "nvidia.com/gpu.compute.minor": str(preset.compute[1]),
        "nvidia.com/gpu.machine": preset.machine,
        "nvidia.com/gpu.mode": "compute",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.capable": "false" if preset.family == "blackwell" else "true",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
        "nvidia.com/cuda.driver-version.full": driver_version,
        "nvidia.com/cuda.runtime-version.major": cuda_major,
        "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        "nvidia.com/cuda.runtime-version.full": cuda_version,
        "feature.node.kubernetes.io/pci-10de.present": "true",
    }
    if preset.nvlink_domain and clique is not None:
        labels["nvidia.com/gpu.clique"] = clique
    return labels


def gpu_uuid(cluster: str, node: str, index: int) -> str:
    """The stable UUID of GPU ``index`` of ``node`` in ``cluster``, in NVML's ``GPU-<uuid>`` form.

    Derived, never stored: the same GPU has the same UUID in its node's labels, its DRA device,
    its DCGM series and after any restart, and no two GPUs of a fleet share one.
    """
    digest = hashlib.sha256(f"gpu/{cluster}/{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
