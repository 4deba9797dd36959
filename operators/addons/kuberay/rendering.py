"""What a member's KubeRay is made of, rendered as pure data: no processes, no API calls.

Upstream runs KubeRay's operator as a Deployment behind a Service, with cert-manager issuing
its webhook's certificate; here it is a process on the member's host, so the webhook's service
reference becomes ``https://127.0.0.1:<port>/<path>`` with the CA of a serving certificate from
fakefleet's PKI in ``caBundle``, and every name gets upstream's ``kuberay-`` prefix. KubeRay
talks to the API server as its own user, bound to upstream's ClusterRole (never
cluster-admin).

Its command line sets every setting it has, within bounds, so that nothing of the operator's
environment or of upstream's defaults (ports on every interface, leader election in a pod's
namespace) decides one: health probes, metrics and the webhook on loopback ports of its own,
leader election off (one replica), its client's QPS and burst, one reconcile at a time per
kind, JSON logs. Only the RayCluster webhook is configured: the binary registers no other
(``main.go`` sets up the RayCluster validator alone), and a webhook whose path its server does
not serve would refuse every RayJob and RayService.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from pathlib import Path
from typing import Any

from operators.addons.kuberay.source import Manifests

#: The user KubeRay's client certificate names; upstream's ClusterRole is bound to it.
USER = "fakefleet:kuberay"
FIELD_MANAGER = "fakefleet-kuberay"
#: The webhooks the binary serves (their paths), of those upstream's manifests list.
SERVED = ("/validate-ray-io-v1-raycluster",)
#: Its client's requests per second and burst: upstream's defaults (100, 200) are for a
#: cluster of its own; these leave room for the engine and the other add-ons of a member.
QPS = 50
BURST = 100
RECONCILE_CONCURRENCY = 1

Object = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class KubeRayPorts:
    """Loopback ports of one member's KubeRay; kept in its state, so its webhook stays valid."""

    webhook: int
    health: int
    metrics: int


def argv(binary: Path, *, ports: KubeRayPorts, cert_dir: Path) -> list[str]:
    """KubeRay's command line: every setting it has, within bounds."""
    return [
        str(binary),
        f"--metrics-addr=127.0.0.1:{ports.metrics}",
        f"--health-probe-bind-address=127.0.0.1:{ports.health}",
        "--enable-leader-election=false",
        f"--reconcile-concurrency={RECONCILE_CONCURRENCY}",
        f"--qps={QPS}",
        f"--burst={BURST}",
        "--log-stdout-encoder=json",
        "--zap-log-level=info",
        # The flags of fakefleet_webhook.go.
        "--webhook-host=127.0.0.1",
        f"--webhook-port={ports.webhook}",
        f"--webhook-cert-dir={cert_dir}",
    ]


def environment(*, kubeconfig: Path) -> dict[str, str]:
    """What KubeRay reads from its environment: its kubeconfig (controller-runtime's), and
    whether it serves its webhooks (upstream's Deployment with webhooks sets it)."""
    return {"KUBECONFIG": str(kubeconfig), "ENABLE_WEBHOOKS": "true"}


def webhook_url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def crds(manifests: Manifests) -> list[Object]:
    """Upstream's CRDs as they are (none is converted by a webhook)."""
    return [copy.deepcopy(crd) for crd in manifests.crds]


def webhook_configurations(manifests: Manifests, *, port: int, ca_pem: bytes) -> list[Object]:
    """Upstream's webhook configurations, prefixed, with the webhooks the binary serves, their
    service references turned into loopback URLs."""
    rendered = []
    for configuration in manifests.webhooks:
        webhooks = []
        for webhook in configuration.get("webhooks") or []:
            path = webhook["clientConfig"]["service"].get("path", "/")
            if path not in SERVED:
                continue
            webhook = copy.deepcopy(webhook)
            webhook["clientConfig"] = {"url": webhook_url(port, path),
                                       "caBundle": base64.b64encode(ca_pem).decode()}
            webhooks.append(webhook)
        if webhooks:
            rendered.append({"apiVersion": configuration["apiVersion"],
                             "kind": configuration["kind"],
                             "metadata": {"name": manifests.prefix
                                          + configuration["metadata"]["name"]},
                             "webhooks": webhooks})
    return rendered


def webhook_configuration_names(manifests: Manifests) -> list[tuple[str, str]]:
    """(plural, name) of every webhook configuration, to delete them when KubeRay goes."""
    plurals = {"MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
               "ValidatingWebhookConfiguration": "validatingwebhookconfigurations"}
    return [(plurals[c["kind"]], manifests.prefix + c["metadata"]["name"])
            for c in manifests.webhooks]


def rbac(manifests: Manifests) -> list[Object]:
    """Upstream's ClusterRole, and its binding to KubeRay's user."""
    role = copy.deepcopy(manifests.role)
    name = role["metadata"]["name"]
    role["metadata"] = {"name": name}
    return [role, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }]
