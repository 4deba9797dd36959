"""KubeRay's manifests, read from its Go module source (``go mod download``), never committed.

What a member gets is what upstream's ``config/default-with-webhooks`` kustomization installs,
taken from the same files: the CRDs of ``config/crd`` (RayCluster, RayJob, RayService), the
operator's ClusterRole (``config/rbac/role.yaml``; leader election is off, so its Role is not
needed) and the webhook configuration of ``config/webhook``, with the name prefix its
kustomization gives. :mod:`operators.addons.kuberay.rendering` points the webhook at loopback.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from operators.addons.kuberay import KUBERAY_MODULE, KUBERAY_VERSION
from operators.controlplane.modules import download, find_go

CRD_DIR = "config/crd"
ROLE_FILE = "config/rbac/role.yaml"
WEBHOOK_DIR = "config/webhook"

Object = dict[str, Any]
#: libyaml's loader where PyYAML has it: the CRDs are 3 MB of YAML, which it reads in a second
#: and the pure-Python loader in tens of seconds (in the operator's thread, holding the GIL).
LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclasses.dataclass(frozen=True)
class Manifests:
    """KubeRay's manifests as upstream ships them (service references, unprefixed names)."""

    crds: tuple[Object, ...]
    role: Object
    webhooks: tuple[Object, ...]
    #: The prefix upstream's webhook kustomization gives the configurations' names.
    prefix: str


def module_dir(version: str = KUBERAY_VERSION) -> Path:
    """Where ``go mod download`` put KubeRay's source (fetched from the proxy if needed)."""
    go = find_go(f"reading KubeRay {version}'s manifests needs the Go toolchain ('go') on PATH: "
                 f"install Go 1.26 or newer")
    return download(go, KUBERAY_MODULE, version, failed=lambda reason: (
        f"cannot fetch {KUBERAY_MODULE}@{version} from the Go module proxy ({reason})")).source


def load(directory: Path) -> Manifests:
    """The manifests in a KubeRay source tree."""
    crd_dir = directory / CRD_DIR
    crds = tuple(_yaml(crd_dir / path)
                 for path in _yaml(crd_dir / "kustomization.yaml")["resources"])
    webhooks = tuple(doc for doc in yaml.load_all(
        (directory / WEBHOOK_DIR / "manifests.yaml").read_text(), Loader=LOADER) if doc)
    return Manifests(crds=crds, role=_yaml(directory / ROLE_FILE), webhooks=webhooks,
                     prefix=_yaml(directory / WEBHOOK_DIR / "kustomization.yaml")["namePrefix"])


def _yaml(path: Path) -> Object:
    loaded: Object = next(doc for doc in yaml.load_all(path.read_text(), Loader=LOADER) if doc)
    return loaded
