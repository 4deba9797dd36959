"""metrics-server's RBAC and APIService, read from its Go module source (``go mod download``),
never committed: ``manifests/base/rbac.yaml`` and ``manifests/base/apiservice.yaml``, as
upstream's kustomization installs them. :mod:`operators.addons.metricsserver.rendering` binds
them to metrics-server's user and points them at loopback.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from operators.addons.metricsserver import METRICS_SERVER_MODULE, METRICS_SERVER_VERSION
from operators.controlplane.modules import download, find_go

RBAC_FILE = "manifests/base/rbac.yaml"
APISERVICE_FILE = "manifests/base/apiservice.yaml"

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Manifests:
    """metrics-server's RBAC and APIService as upstream ships them."""

    rbac: tuple[Object, ...]
    apiservice: Object


def module_dir(version: str = METRICS_SERVER_VERSION) -> Path:
    """Where ``go mod download`` put metrics-server's source (fetched from the proxy if
    needed)."""
    go = find_go(f"reading metrics-server {version}'s manifests needs the Go toolchain ('go') "
                 f"on PATH: install Go 1.26 or newer")
    return download(go, METRICS_SERVER_MODULE, version, failed=lambda reason: (
        f"cannot fetch {METRICS_SERVER_MODULE}@{version} from the Go module proxy "
        f"({reason})")).source


def load(directory: Path) -> Manifests:
    rbac = tuple(doc for doc in yaml.safe_load_all((directory / RBAC_FILE).read_text()) if doc)
    apiservice: Object = yaml.safe_load((directory / APISERVICE_FILE).read_text())
    return Manifests(rbac=rbac, apiservice=apiservice)


