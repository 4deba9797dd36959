"""What a member's metrics-server is made of, rendered as pure data: no processes, no API calls.

Upstream installs metrics-server as a Deployment behind a Service in ``kube-system``; here it is
a process on the member's host listening on a loopback port. The aggregation layer reaches an
APIService only through a Service, and refuses loopback addresses in Endpoints, but resolves a
Service of type ExternalName to ``https://<externalName>:<APIService port>`` (k8s.io/apiserver's
``ResolveCluster``, used unless ``--enable-aggregator-routing``); so the Service is
``ExternalName: localhost``, the APIService names its port, and the serving certificate is made
for the name the aggregator verifies, ``metrics-server.kube-system.svc``, under a CA of its own
given as the ``caBundle``.

The RBAC is upstream's (``manifests/base/rbac.yaml`` in the module source), bound to
metrics-server's own user instead of its ServiceAccount; the APIService is upstream's
(``manifests/base/apiservice.yaml``) with the ``caBundle`` in place of
``insecureSkipTLSVerify``. metrics-server scrapes the nodes the engine plays (label
``fakefleet.dev/pool``) at their InternalIPs on the engine's plain port, over plain HTTP
(:mod:`operators.engine.serving` says why), not at the port the nodes advertise: that one is
the kubelet API over TLS, which the member's API server uses (``kubectl logs``).
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

from operators.addons.metricsserver.source import Manifests
from primitives import keys

NAMESPACE = "kube-system"
SERVICE = "metrics-server"
#: The name the aggregation layer verifies the serving certificate for.
SERVICE_HOST = f"{SERVICE}.{NAMESPACE}.svc"
#: The user metrics-server's client certificate names; upstream's roles are bound to it.
USER = "fakefleet:metrics-server"
FIELD_MANAGER = "fakefleet-metrics-server"
APISERVICE = "v1beta1.metrics.k8s.io"
#: Longest a scrape of one node may take (metrics-server wants it under 9/10 of the
#: resolution, which is at least 10 s).
KUBELET_REQUEST_TIMEOUT = "5s"

Object = dict[str, Any]


def argv(binary: Path, *, kubeconfig: Path, port: int, cert: Path, key: Path,
         resolution: str, kubelet_port: int) -> list[str]:
    """metrics-server's command line for one member; ``kubelet_port``: the engine's plain
    one."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        f"--metric-resolution={resolution}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-port={kubelet_port}",
        "--deprecated-kubelet-completely-insecure",
        f"--kubelet-request-timeout={KUBELET_REQUEST_TIMEOUT}",
        # Only the engine's nodes have kubelets to scrape.
        f"--node-selector={keys.POOL}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez",
    ]


def rbac(manifests: Manifests) -> list[Object]:
    """Upstream's roles and bindings, bound to metrics-server's user (no ServiceAccount)."""
    rendered = []
    for obj in manifests.rbac:
        if obj["kind"] == "ServiceAccount":
            continue
        obj = copy.deepcopy(obj)
        if "subjects" in obj:
            obj["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                "name": USER}]
        rendered.append(obj)
    return rendered


def service(port: int) -> Object:
    """The Service the APIService names: the aggregator resolves it to localhost:<port>."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE,
                         "labels": {"app.kubernetes.io/managed-by": "fakefleet"}},
            "spec": {"type": "ExternalName", "externalName": "localhost",
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}}


def apiservice(manifests: Manifests, *, port: int, ca_pem: bytes) -> Object:
    """Upstream's APIService, verified with our CA, at the loopback port."""
    obj = copy.deepcopy(manifests.apiservice)
    spec = obj["spec"]
    spec.pop("insecureSkipTLSVerify", None)
    spec["caBundle"] = base64.b64encode(ca_pem).decode()
    spec["service"] = {**spec["service"], "port": port}
    return obj
