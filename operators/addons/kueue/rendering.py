"""What a member's Kueue is made of, rendered as pure data: no processes, no API calls.

Upstream installs Kueue as a Deployment behind a Service; here it is a process on the member's
host, so every service reference (webhooks, CRD conversion) becomes ``https://127.0.0.1:<port>``
with the CA of the serving certificate in ``caBundle``, and every name gets the ``kueue-`` prefix
and the ``kueue-system`` namespace that upstream's kustomization gives it. Kueue talks to the API
server as its own user, bound to upstream's manager roles (never cluster-admin).

The Configuration (``config.kueue.x-k8s.io/v1beta2``): certificates are ours (internal cert
management off), webhook, health probes and metrics listen on loopback ports of their own,
leader election is off (one replica), the batch/v1 Job integration is on, and the visibility
API server is off (it would need an APIService and a Service to be reachable).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from pathlib import Path
from typing import Any

from operators.addons.kueue.source import Manifests

NAMESPACE = "kueue-system"
PREFIX = "kueue-"
#: The user Kueue's client certificate names; its roles are bound to it.
USER = "fakefleet:kueue"
FIELD_MANAGER = "fakefleet-kueue"
CONFIG_API_VERSION = "config.kueue.x-k8s.io/v1beta2"
FRAMEWORKS = ("batch/job",)
MULTIKUEUE_GC_INTERVAL = "1m"

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class KueuePorts:
    """Loopback ports of one member's Kueue; kept in its state, so webhooks stay valid."""

    webhook: int
    health: int
    metrics: int


@dataclasses.dataclass(frozen=True)
class MultiKueueSettings:
    """Kueue's multiKueue settings, for a manager."""

    worker_lost_timeout: str


def configuration(ports: KueuePorts, cert_dir: Path,
                  multikueue: MultiKueueSettings | None) -> Object:
    """Kueue's Configuration file for one member."""
    config: Object = {
        "apiVersion": CONFIG_API_VERSION,
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.metrics}"},
        "webhook": {"host": "127.0.0.1", "port": ports.webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": {"VisibilityOnDemand": False},
    }
    if multikueue is not None:
        config["multiKueue"] = {"gcInterval": MULTIKUEUE_GC_INTERVAL,
                                "workerLostTimeout": multikueue.worker_lost_timeout}
    return config


def argv(binary: Path, *, config: Path, kubeconfig: Path) -> list[str]:
    """Kueue's command line: everything else is in its Configuration."""
    return [str(binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
            "--zap-log-level=info"]


def webhook_url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def ca_bundle(ca_pem: bytes) -> str:
    return base64.b64encode(ca_pem).decode()


def crds(manifests: Manifests, *, port: int, ca_pem: bytes) -> list[Object]:
    """Upstream's CRDs; those it converts call the loopback webhook at ``/convert``."""
    rendered = []
    for crd in manifests.crds:
        crd = copy.deepcopy(crd)
        if crd["metadata"]["name"] in manifests.converted:
            crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                "clientConfig": {"url": webhook_url(port, "/convert"),
                                 "caBundle": ca_bundle(ca_pem)},
                "conversionReviewVersions": ["v1"],
            }}
        rendered.append(crd)
    return rendered


def webhook_configurations(manifests: Manifests, *, port: int, ca_pem: bytes) -> list[Object]:
    """Upstream's webhook configurations, prefixed, their service references turned into
    loopback URLs, with the namespace selectors of upstream's kustomization."""
    rendered = []
    for configuration_ in manifests.webhooks:
        configuration_ = copy.deepcopy(configuration_)
        configuration_["metadata"] = {"name": PREFIX + configuration_["metadata"]["name"]}
        for webhook in configuration_.get("webhooks") or []:
            path = webhook["clientConfig"]["service"].get("path", "/")
            webhook["clientConfig"] = {"url": webhook_url(port, path),
                                       "caBundle": ca_bundle(ca_pem)}
            selector = manifests.namespace_selectors.get(webhook["name"])
            if selector is not None:
                webhook["namespaceSelector"] = copy.deepcopy(selector)
        rendered.append(configuration_)
    return rendered


def webhook_configuration_names(manifests: Manifests) -> list[tuple[str, str]]:
    """(plural, name) of every webhook configuration, to delete them when Kueue goes."""
    plurals = {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
               "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}
    return [(plurals[c["kind"]], PREFIX + c["metadata"]["name"]) for c in manifests.webhooks]


def rbac(manifests: Manifests) -> list[Object]:
    """Upstream's manager roles, prefixed, and bindings of each to Kueue's user."""
    rendered: list[Object] = []
    for role in manifests.roles:
        role = copy.deepcopy(role)
        name = PREFIX + role["metadata"]["name"]
        role["metadata"]["name"] = name
        subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}
        binding: Object = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding" if role["kind"] == "Role" else "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role["kind"],
                        "name": name},
            "subjects": [subject],
        }
        if role["kind"] == "Role":
            role["metadata"]["namespace"] = NAMESPACE
            binding["metadata"]["namespace"] = NAMESPACE
        rendered += [role, binding]
    return rendered


def namespace() -> Object:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
