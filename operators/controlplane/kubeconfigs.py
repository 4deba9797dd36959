"""Kubeconfig files: self-contained (certificates embedded), so they work when copied anywhere.

Real tools accept them as they are: kubectl, client-go, MultiKueue and Karmada (which read the
``kubeconfig`` key of a Secret), and :mod:`operators.k8s`.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def render(*, cluster: str, server: str, ca_cert: Path, client_cert: Path, client_key: Path,
           user: str = "admin") -> str:
    """A kubeconfig with one cluster, one user and one current context, all named ``cluster``."""
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": cluster,
            "cluster": {
                "server": server,
                "certificate-authority-data": _b64(ca_cert),
            },
        }],
        "users": [{
            "name": f"{cluster}-{user}",
            "user": {
                "client-certificate-data": _b64(client_cert),
                "client-key-data": _b64(client_key),
            },
        }],
        "contexts": [{
            "name": cluster,
            "context": {"cluster": cluster, "user": f"{cluster}-{user}"},
        }],
        "current-context": cluster,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()
