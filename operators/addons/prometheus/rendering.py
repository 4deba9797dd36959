"""What a member's Prometheus is made of, rendered as pure data: no processes, no API calls.

Upstream runs Prometheus in the cluster (a StatefulSet, or prometheus-operator's); here it is a
process on the member's host, listening on a loopback port of its own, its TSDB in the member's
state directory, kept small (``retention``, and at most :data:`RETENTION_SIZE` whatever that
says). It discovers pods as a platform team's pod job does, ``kubernetes_sd_configs`` role
``pod`` against the member's API server, as its own user with the RBAC to list and watch pods,
and relabels each target as a PodMonitor would compile to, with one difference: pod addresses
(10.128.0.0/9) are not routed on this host, so a pod is scraped through its node, at the
engine's plain port, ``http://<hostIP>:<engine port>/pods/<namespace>/<pod>/metrics``
(:mod:`operators.engine.serving`).

Which pods: those annotated ``prometheus.io/scrape: "true"`` (the convention every Prometheus
chart's pod job honours), and, when ``spec.addons.customMetrics.metrics`` lists metrics, every
pod with an annotation of one of them (``fakefleet.dev/metric.<name>``), so that nothing else
is needed. Every pod would be a target every scrape interval otherwise, thousands at a bench's
size. The engine's page labels its series ``namespace``, ``pod`` and ``container`` as this
relabelling would; the job honours them (``honor_labels``) rather than renaming them
``exported_*``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primitives import keys

FIELD_MANAGER = "fakefleet-prometheus"
#: The user Prometheus' client certificate names; its role is bound to it.
USER = "fakefleet:prometheus"
ROLE = "fakefleet:prometheus"
JOB = "kubernetes-pods"
#: The annotation a pod opts in with, as every Prometheus chart's pod job reads it.
SCRAPE_ANNOTATION = "prometheus.io/scrape"
#: The most disk its samples take, whatever the retention.
RETENTION_SIZE = "256MiB"
META = "__meta_kubernetes_pod_"

Object = dict[str, Any]


def argv(binary: Path, *, config: Path, data: Path, port: int) -> list[str]:
    """Prometheus' command line for one member."""
    return [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        # Its default is every interface (0.0.0.0:9090).
        f"--web.listen-address=127.0.0.1:{port}",
        # Its default sets GOMEMLIMIT to 90% of the host's memory, per process: with a
        # Prometheus per member, each would think it had the host. (kingpin turns a boolean
        # off with --no-<flag>; it refuses --<flag>=false.)
        "--no-auto-gomemlimit",
    ]


def duration(seconds: float) -> str:
    """A duration as Prometheus reads it: whole units only (``5s``, ``1500ms``)."""
    milliseconds = round(seconds * 1000)
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def present(metric: str) -> str:
    """The meta label that says a pod has the annotation of ``metric`` (Prometheus turns an
    annotation's name into a label name by replacing what a label name cannot hold by ``_``)."""
    key = f"{keys.METRIC_PREFIX}{metric}"
    return META + "annotationpresent_" + "".join(c if c.isalnum() or c == "_" else "_"
                                                 for c in key)


def config(*, kubeconfig: Path, engine_port: int, scrape_interval: float, retention: float,
           metrics: list[str]) -> Object:
    """Prometheus' configuration: one pod job, scraping through the pods' nodes."""
    opted_in = [f"{META}annotation_prometheus_io_scrape", *(present(m) for m in metrics)]
    return {
        "global": {"scrape_interval": duration(scrape_interval)},
        "storage": {"tsdb": {"retention": {"time": duration(retention),
                                           "size": RETENTION_SIZE}}},
        "scrape_configs": [{
            "job_name": JOB,
            "honor_labels": True,
            "kubernetes_sd_configs": [{
                "role": "pod",
                "kubeconfig_file": str(kubeconfig),
                # A pod without containers running serves nothing.
                "selectors": [{"role": "pod", "field": "status.phase=Running"}],
            }],
            "relabel_configs": [
                # prometheus.io/scrape: "true", or an annotation of a listed metric.
                {"source_labels": opted_in, "regex": "(.*;)?true(;.*)?", "action": "keep"},
                {"source_labels": [f"{META}host_ip"], "regex": ".+", "action": "keep"},
                # Pod addresses are not routed here: through the node, at the engine's plain port.
                {"source_labels": [f"{META}host_ip"], "regex": "(.+)",
                 "target_label": "__address__", "replacement": f"${{1}}:{engine_port}"},
                {"source_labels": ["__meta_kubernetes_namespace", f"{META}name"],
                 "regex": "(.+);(.+)", "target_label": "__metrics_path__",
                 "replacement": "/pods/${1}/${2}/metrics"},
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": [f"{META}name"], "target_label": "pod"},
                {"source_labels": [f"{META}node_name"], "target_label": "node"},
            ],
        }],
    }


def rbac() -> list[Object]:
    """What its pod discovery needs: list and watch pods, bound to its user."""
    labels = {"app.kubernetes.io/managed-by": "fakefleet"}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": ROLE, "labels": labels},
         "rules": [{"apiGroups": [""], "resources": ["pods"],
                    "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": ROLE, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": ROLE},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": USER}]},
    ]
