"""What a member's custom-metrics adapter is made of, rendered as pure data: no processes, no
API calls.

The adapter runs as metrics-server does here (:mod:`operators.addons.metricsserver.rendering`
says why each piece): a process on the member's host on a loopback port, reached by the
aggregation layer through a Service of type ExternalName ``localhost``, its serving certificate
made for the name the aggregator verifies under a CA of its own given as the APIServices'
``caBundle``, its callers authenticated and authorized by the member's API server (delegated:
TokenReview, SubjectAccessReview, the front proxy's CA from
``kube-system/extension-apiserver-authentication``). Its RBAC is what upstream's sample
deployment grants an adapter (``test-adapter-deploy/testing-adapter.yaml``), bound to its own
user, and the pods it lists to answer a selector: the HPA controller's own role reads
``custom.metrics.k8s.io`` already (the bootstrap policy's
``system:controller:horizontal-pod-autoscaler``).

Both versions the library serves are registered, ``v1beta2`` preferred, as upstream's
deployment does: the HPA controller asks discovery which one to use.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

NAMESPACE = "kube-system"
SERVICE = "custom-metrics-apiserver"
#: The name the aggregation layer verifies the serving certificate for.
SERVICE_HOST = f"{SERVICE}.{NAMESPACE}.svc"
#: The user the adapter's client certificate names; its roles are bound to it.
USER = "fakefleet:custom-metrics-adapter"
FIELD_MANAGER = "fakefleet-custom-metrics-adapter"
GROUP = "custom.metrics.k8s.io"
#: The versions registered, each with its priority (the higher preferred).
VERSIONS = {"v1beta2": 200, "v1beta1": 100}
APISERVICES = tuple(f"{version}.{GROUP}" for version in VERSIONS)
MANAGED_BY = {"app.kubernetes.io/managed-by": "fakefleet"}
RBAC_API = "rbac.authorization.k8s.io"

Object = dict[str, Any]


def argv(binary: Path, *, kubeconfig: Path, port: int, cert: Path, key: Path,
         prometheus: int, metrics: list[str]) -> list[str]:
    """The adapter's command line for one member."""
    return [
        str(binary),
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez",
        f"--prometheus-url=http://127.0.0.1:{prometheus}",
        *(f"--metric={metric}" for metric in sorted(metrics)),
    ]


def _subject() -> list[Object]:
    return [{"apiGroup": RBAC_API, "kind": "User", "name": USER}]


def rbac() -> list[Object]:
    """Delegated authentication and authorization, and listing the pods a selector names."""
    role = "fakefleet:custom-metrics-adapter"
    return [
        {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{role}:system:auth-delegator", "labels": dict(MANAGED_BY)},
         "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole",
                     "name": "system:auth-delegator"},
         "subjects": _subject()},
        {"apiVersion": f"{RBAC_API}/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{role}:auth-reader", "namespace": NAMESPACE,
                      "labels": dict(MANAGED_BY)},
         "roleRef": {"apiGroup": RBAC_API, "kind": "Role",
                     "name": "extension-apiserver-authentication-reader"},
         "subjects": _subject()},
        {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRole",
         "metadata": {"name": role, "labels": dict(MANAGED_BY)},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]},
        {"apiVersion": f"{RBAC_API}/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role, "labels": dict(MANAGED_BY)},
         "roleRef": {"apiGroup": RBAC_API, "kind": "ClusterRole", "name": role},
         "subjects": _subject()},
    ]


def service(port: int) -> Object:
    """The Service the APIServices name: the aggregator resolves it to localhost:<port>."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": dict(MANAGED_BY)},
            "spec": {"type": "ExternalName", "externalName": "localhost",
                     "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}}


def apiservices(*, port: int, ca_pem: bytes) -> list[Object]:
    """custom.metrics.k8s.io's APIServices, verified with the adapter's CA, at its port."""
    return [{
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": f"{version}.{GROUP}", "labels": dict(MANAGED_BY)},
        "spec": {"group": GROUP, "version": version, "groupPriorityMinimum": 100,
                 "versionPriority": priority,
                 "service": {"name": SERVICE, "namespace": NAMESPACE, "port": port},
                 "caBundle": base64.b64encode(ca_pem).decode()},
    } for version, priority in VERSIONS.items()]
