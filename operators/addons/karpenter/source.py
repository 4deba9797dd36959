"""Karpenter's CRDs, read from its Go module source (``go mod download``), never committed.

The KWOK provider's chart carries NodePool, NodeClaim and NodeOverlay (``kwok/charts/crds``:
copies of the core CRDs with a rule that keeps the ``karpenter.kwok.sh`` label domain to the
provider's own keys); its KWOKNodeClass is only in ``kwok/apis/crds``, embedded in the binary
but applied by nothing at run time. A member gets these four: NodeOverlay is used only behind a
feature gate and does no harm, and the CapacityBuffer CRD of ``autoscaling.x-k8s.io`` (another
feature gate, off) is left out, as a user's own cluster-autoscaler may bring that group.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from operators.addons.karpenter import KARPENTER_MODULE, KARPENTER_VERSION
from operators.controlplane.modules import download, find_go

CRD_FILES = (
    "kwok/charts/crds/karpenter.sh_nodepools.yaml",
    "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
    "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
    "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
)

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Manifests:
    """Karpenter's CRDs as upstream ships them."""

    crds: tuple[Object, ...]


def module_dir(version: str = KARPENTER_VERSION) -> Path:
    """Where ``go mod download`` put Karpenter's source (fetched from the proxy if needed)."""
    go = find_go(f"reading Karpenter {version}'s CRDs needs the Go toolchain ('go') on PATH: "
                 f"install Go 1.26 or newer")
    return download(go, KARPENTER_MODULE, version, failed=lambda reason: (
        f"cannot fetch {KARPENTER_MODULE}@{version} from the Go module proxy "
        f"({reason})")).source


def load(directory: Path) -> Manifests:
    return Manifests(crds=tuple(_yaml(directory / path) for path in CRD_FILES))


def _yaml(path: Path) -> Object:
    loaded: Object = next(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    return loaded
