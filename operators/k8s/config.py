"""Connection settings from a kubeconfig: the server URL and TLS, nothing else read."""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import yaml

from operators.k8s.errors import K8sError


@dataclasses.dataclass(frozen=True)
class ClusterAccess:
    """How to reach one API server."""

    server: str
    tls: ssl.SSLContext
    token: str | None = None


def load_kubeconfig(text: str, *, context: str | None = None) -> ClusterAccess:
    """Parse a kubeconfig (certificate data or file paths, token or client certificate)."""
    try:
        config: dict[str, Any] = yaml.safe_load(text) or {}
        name = context or config["current-context"]
        ctx = _named(config, "contexts", name)["context"]
        cluster = _named(config, "clusters", ctx["cluster"])["cluster"]
        user = _named(config, "users", ctx["user"])["user"] if ctx.get("user") else {}
        server = cluster["server"].rstrip("/")
    except (KeyError, TypeError, yaml.YAMLError) as error:
        raise K8sError(f"the kubeconfig is incomplete or malformed ({error!r})") from error

    tls = ssl.create_default_context()
    if cluster.get("insecure-skip-tls-verify"):
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    elif "certificate-authority-data" in cluster:
        tls.load_verify_locations(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    elif "certificate-authority" in cluster:
        tls.load_verify_locations(cafile=cluster["certificate-authority"])
    cert = _pem(user, "client-certificate")
    key = _pem(user, "client-key")
    if cert is not None and key is not None:
        _load_chain(tls, cert, key)
    return ClusterAccess(server=server, tls=tls, token=user.get("token"))


def load_kubeconfig_file(path: Path) -> ClusterAccess:
    return load_kubeconfig(path.read_text())


def _named(config: dict[str, Any], section: str, name: str) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            found: dict[str, Any] = entry
            return found
    raise KeyError(f"{section}/{name}")


def _pem(user: dict[str, Any], field: str) -> bytes | None:
    if f"{field}-data" in user:
        return base64.b64decode(user[f"{field}-data"])
    if field in user:
        return Path(user[field]).read_bytes()
    return None


def _load_chain(tls: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    # ssl only loads client certificates from files: write them to a private temporary file.
    fd, path = tempfile.mkstemp(prefix="fakefleet-client-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(cert + b"\n" + key)
        tls.load_cert_chain(path)
    finally:
        os.unlink(path)
