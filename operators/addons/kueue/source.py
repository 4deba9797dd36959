"""Kueue's manifests, read from its Go module source (``go mod download``), never committed.

What a member gets is what upstream's kustomization would install, taken from the same files:
the CRDs (``config/components/crd/bases``) with the conversion webhooks that
``config/components/crd/kustomization.yaml`` patches in, the manager's RBAC
(``config/components/rbac``: its ClusterRole, the Role on Secrets of its namespace, the
metrics-auth ClusterRole) and the webhook configurations (``config/components/webhook``) with the
namespace selectors that kustomization adds. :mod:`operators.addons.kueue.rendering` then
points them at loopback.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from operators.addons.kueue import KUEUE_MODULE, KUEUE_VERSION
from operators.controlplane.modules import download, find_go

CRD_DIR = "config/components/crd"
RBAC_DIR = "config/components/rbac"
WEBHOOK_DIR = "config/components/webhook"
#: The manager's own RBAC: what it needs to run, nothing of the user-facing roles.
RBAC_FILES = ("role.yaml", "manager_secrets_role.yaml", "metrics_auth_role.yaml")

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Manifests:
    """Kueue's manifests as upstream ships them (service references, unprefixed names)."""

    version: str
    crds: tuple[Object, ...]
    #: Names of the CRDs whose versions upstream converts with its webhook (``/convert``).
    converted: frozenset[str]
    roles: tuple[Object, ...]
    webhooks: tuple[Object, ...]
    #: Webhook name → the namespaceSelector upstream's kustomization patches in.
    namespace_selectors: dict[str, Object]


def module_dir(version: str = KUEUE_VERSION) -> Path:
    """Where ``go mod download`` put Kueue's source (fetched from the proxy if needed)."""
    go = find_go(f"reading Kueue {version}'s manifests needs the Go toolchain ('go') on PATH: "
                 f"install Go 1.26 or newer")
    return download(go, KUEUE_MODULE, version, failed=lambda reason: (
        f"cannot fetch {KUEUE_MODULE}@{version} from the Go module proxy ({reason})")).source


def load(directory: Path, version: str = KUEUE_VERSION) -> Manifests:
    """The manifests in a Kueue source tree."""
    crd_dir = directory / CRD_DIR
    kustomization = _yaml(crd_dir / "kustomization.yaml")
    crds = tuple(_yaml(crd_dir / path) for path in kustomization["resources"])
    converted = frozenset(_yaml(crd_dir / patch["path"])["metadata"]["name"]
                          for patch in kustomization.get("patches") or [])
    roles = tuple(_yaml(directory / RBAC_DIR / name) for name in RBAC_FILES)
    webhooks = tuple(doc for doc in yaml.safe_load_all(
        (directory / WEBHOOK_DIR / "manifests.yaml").read_text()) if doc)
    return Manifests(version=version, crds=crds, converted=converted, roles=roles,
                     webhooks=webhooks,
                     namespace_selectors=_namespace_selectors(
                         _yaml(directory / WEBHOOK_DIR / "kustomization.yaml")))


def _namespace_selectors(kustomization: Object) -> dict[str, Object]:
    found: dict[str, Object] = {}
    for patch in kustomization.get("patches") or []:
        for webhook in yaml.safe_load(patch["patch"]).get("webhooks") or []:
            if "namespaceSelector" in webhook:
                found[webhook["name"]] = webhook["namespaceSelector"]
    return found


def _yaml(path: Path) -> Object:
    loaded: Object = yaml.safe_load(path.read_text())
    return loaded
