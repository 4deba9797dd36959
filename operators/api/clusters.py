"""FakeCluster: one simulated Kubernetes cluster, with a real control plane."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from operators.api.appmetrics import MAX_NAME_LENGTH, NAME_PATTERN
from operators.api.base import (
    Condition,
    CustomResource,
    Model,
    PrinterColumn,
    ResourceInfo,
    immutable,
)
from operators.api.durations import DURATION_LENGTH, DURATION_PATTERN, parse_duration
from operators.api.names import Labels, label_value, rule, validations
from primitives import keys
from primitives.names import CLUSTER_NAME_MAX_LENGTH, LABEL_VALUE_MAX_LENGTH

DEFAULT_KUBERNETES_VERSION = "v1.36.3"
KUBECONFIG_KEY = "kubeconfig"
#: A FakeCluster's name is a label value (:data:`~primitives.keys.CLUSTER`); the other names
#: made from it (the Secret ``<name>-kubeconfig``, directories, the etcd prefix) allow more.
MAX_CLUSTER_NAME_LENGTH = CLUSTER_NAME_MAX_LENGTH

NAME_RULE = rule(
    f"size(self.metadata.name) <= {MAX_CLUSTER_NAME_LENGTH}",
    f"a FakeCluster name has at most {MAX_CLUSTER_NAME_LENGTH} characters: it is the value of "
    f"the label {keys.CLUSTER} (label values hold at most {LABEL_VALUE_MAX_LENGTH}) and names "
    "the cluster's kubeconfig Secret, directories, etcd prefix and certificates; choose a "
    "shorter name",
    field_path=".metadata.name",
)


_KUEUE_ON = ("has(self.spec.addons) && has(self.spec.addons.kueue) && "
             "self.spec.addons.kueue.enabled")
KUEUE_LOCAL_RULE = rule(
    f"!({_KUEUE_ON}) || !has(self.spec.controlPlane) || self.spec.controlPlane.backend == 'local'",
    "spec.addons.kueue needs controlPlane.backend 'local': Kueue's webhooks listen on this "
    "host's loopback, which the API server of an adopted (external) cluster cannot call; "
    "remove spec.addons.kueue, or set kueue.enabled: false",
    field_path=".spec.addons.kueue",
)
METRICS_SERVER_LOCAL_RULE = rule(
    "!(has(self.spec.addons) && has(self.spec.addons.metricsServer) && "
    "self.spec.addons.metricsServer.enabled) || !has(self.spec.controlPlane) || "
    "self.spec.controlPlane.backend == 'local'",
    "spec.addons.metricsServer needs controlPlane.backend 'local': metrics-server listens on "
    "this host's loopback, which the aggregation layer of an adopted (external) cluster cannot "
    "reach; remove spec.addons.metricsServer, or set metricsServer.enabled: false",
    field_path=".spec.addons.metricsServer",
)
KARPENTER_LOCAL_RULE = rule(
    "!(has(self.spec.addons) && has(self.spec.addons.karpenter) && "
    "self.spec.addons.karpenter.enabled) || !has(self.spec.controlPlane) || "
    "self.spec.controlPlane.backend == 'local'",
    "spec.addons.karpenter needs controlPlane.backend 'local': fakefleet runs Karpenter on this "
    "host with the cluster's admin kubeconfig, which it has only for a cluster it runs; remove "
    "spec.addons.karpenter, or set karpenter.enabled: false",
    field_path=".spec.addons.karpenter",
)
KUBERAY_LOCAL_RULE = rule(
    "!(has(self.spec.addons) && has(self.spec.addons.kuberay) && "
    "self.spec.addons.kuberay.enabled) || !has(self.spec.controlPlane) || "
    "self.spec.controlPlane.backend == 'local'",
    "spec.addons.kuberay needs controlPlane.backend 'local': KubeRay's webhook listens on this "
    "host's loopback, which the API server of an adopted (external) cluster cannot call; "
    "remove spec.addons.kuberay, or set kuberay.enabled: false",
    field_path=".spec.addons.kuberay",
)
CUSTOM_METRICS_LOCAL_RULE = rule(
    "!(has(self.spec.addons) && has(self.spec.addons.customMetrics) && "
    "self.spec.addons.customMetrics.enabled) || !has(self.spec.controlPlane) || "
    "self.spec.controlPlane.backend == 'local'",
    "spec.addons.customMetrics needs controlPlane.backend 'local': its Prometheus scrapes the "
    "pods through the engine's nodes and its adapter listens on this host's loopback, which "
    "the aggregation layer of an adopted (external) cluster cannot reach; remove "
    "spec.addons.customMetrics, or set customMetrics.enabled: false",
    field_path=".spec.addons.customMetrics",
)
KUEUE_NOT_OWN_WORKER_RULE = rule(
    f"!({_KUEUE_ON}) || !has(self.spec.addons.kueue.multiKueue) || "
    "!(self.metadata.name in self.spec.addons.kueue.multiKueue.workers)",
    "spec.addons.kueue.multiKueue.workers lists this cluster itself: a MultiKueue manager "
    "dispatches to other FakeClusters; remove its own name from workers",
    field_path=".spec.addons.kueue.multiKueue.workers",
)


class SecretKeyRef(Model):
    """A key of a Secret in the FakeCluster's namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Name of the Secret."""
    key: str = Field(default=KUBECONFIG_KEY, min_length=1)
    """Key in the Secret's data that holds the kubeconfig."""


#: ``host:port``: a DNS name, an IPv4 address or a bracketed IPv6 address, and a port from 1 to
#: 65535. A pattern, not a CEL rule: it costs nothing of the CRD's CEL budget.
HUB_ADDRESS_PATTERN = (
    r"^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*"
    r"|\[[0-9A-Fa-f:.]+\])"
    r":([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$")
#: A Secret's name: a DNS subdomain, as Kubernetes requires of it.
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: Keys of the Secret that ``credentialsSecret`` names.
TOKEN_KEY = "token"
CA_KEY = "ca.crt"


class FederationSpec(Model):
    """How the cluster joins a gRPC federation hub. Without spec.federation it joins as with
    {enabled: true}: the hub that 'fakefleet up' started on this host, if there is one."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        rule("!has(self.address) || has(self.credentialsSecret)",
             "federation.address needs federation.credentialsSecret: name the Secret (keys "
             "token and ca.crt) with this cluster's member token and that hub's CA, or remove "
             "address to join the hub of this host",
             field_path=".credentialsSecret"),
        rule("!has(self.credentialsSecret) || has(self.address)",
             "federation.credentialsSecret is for the hub that federation.address names: set "
             "address (host:port), or remove credentialsSecret to join the hub of this host",
             field_path=".address"),
    )}

    enabled: bool = True
    """Whether the cluster joins a hub at all; false: it joins none, and fleet-wide plans and
    workloads do not reach it."""
    address: str | None = Field(default=None, max_length=253, pattern=HUB_ADDRESS_PATTERN)
    """host:port of the hub, e.g. hub.example.com:7443 or [::1]:7443; needs
    credentialsSecret. Absent: the hub that 'fakefleet up' started on this host (the operator
    knows its address and credentials)."""
    credentialsSecret: str | None = Field(default=None, min_length=1, max_length=253,
                                          pattern=SECRET_NAME_PATTERN)
    """A Secret in the FakeCluster's namespace with key 'token' (the member token the hub
    issued for this cluster's name) and key 'ca.crt' (the hub's CA certificate, PEM); needs
    address."""

    @property
    def joins_local_hub(self) -> bool:
        """Whether the cluster joins the hub that 'fakefleet up' started on this host."""
        return self.enabled and self.address is None


#: The node-lifecycle controller's grace period: kube-controller-manager's default, and the
#: range spec.controlPlane.nodeMonitorGracePeriod allows.
DEFAULT_NODE_MONITOR_GRACE = "50s"
MIN_NODE_MONITOR_GRACE, MAX_NODE_MONITOR_GRACE = "10s", "10m"


class ControlPlaneSpec(Model):
    """Where the cluster's API server comes from."""

    model_config = Model.model_config | {"json_schema_extra": {"x-kubernetes-validations": [
        {
            "rule": "self.backend != 'external' || has(self.kubeconfigSecretRef)",
            "message": "backend 'external' needs kubeconfigSecretRef: name the Secret that "
                       "holds the kubeconfig of the cluster to adopt",
            "fieldPath": ".kubeconfigSecretRef",
        },
        {
            "rule": "self.backend != 'local' || !has(self.kubeconfigSecretRef)",
            "message": "kubeconfigSecretRef is only for backend 'external': remove it, or set "
                       "backend: external to adopt that cluster",
            "fieldPath": ".kubeconfigSecretRef",
        },
    ]}}

    backend: Literal["local", "external"] = "local"
    """'local' starts a real kube-apiserver (and scheduler, controller-manager) on the shared
    etcd; 'external' adopts an existing cluster from kubeconfigSecretRef and only simulates its
    nodes and pods."""
    kubeconfigSecretRef: SecretKeyRef | None = None
    """For backend 'external': the Secret with the kubeconfig of the cluster to adopt."""
    scheduler: bool = True
    """Run the real kube-scheduler (backend 'local')."""
    controllerManager: bool = True
    """Run the real kube-controller-manager (backend 'local')."""
    profile: Literal["default", "load"] | None = None
    """'load' lifts the API server's request limits, for load tests (backend 'local'). Unset:
    the operator's --default-profile ('default' unless the operator was started otherwise, as
    the chart's controlPlane.profile does)."""
    nodeMonitorGracePeriod: str | None = Field(
        default=None, pattern=DURATION_PATTERN, max_length=DURATION_LENGTH,
        json_schema_extra=validations(rule(
            f"duration(self) >= duration('{MIN_NODE_MONITOR_GRACE}') && "
            f"duration(self) <= duration('{MAX_NODE_MONITOR_GRACE}')",
            f"give a nodeMonitorGracePeriod from {MIN_NODE_MONITOR_GRACE} to "
            f"{MAX_NODE_MONITOR_GRACE}, e.g. 20s, or remove it for the controller-manager's "
            f"default of {DEFAULT_NODE_MONITOR_GRACE}")))
    """How long the node-lifecycle controller waits for a node's Lease renewal before it marks
    the node NotReady (Unknown), from 10s to 10m: the controller-manager's
    --node-monitor-grace-period (backend 'local'), and the grace the engine paces its Lease
    renewals by and raises a pool's HeartbeatsAtRisk at 3/4 of (either backend; for
    'external' say what the adopted cluster's controller-manager uses). Unset: the
    controller-manager's default, 50s. Shorter: node faults (Unreachable, NotReady) are
    seen sooner; the engine renews more often (at most every fifth of it)."""

    @property
    def node_grace(self) -> float | None:
        """The node-lifecycle controller's grace period in seconds; None: unset (the
        controller-manager's default, which the engine assumes too)."""
        if self.nodeMonitorGracePeriod is None:
            return None
        return parse_duration(self.nodeMonitorGracePeriod)


#: A FakeCluster's name as ``multiKueue.workers`` lists it: a DNS label (a label value too).
CLUSTER_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_MULTIKUEUE_WORKERS = 16
#: The MultiKueueConfig the operator keeps on a manager: ClusterQueues' AdmissionChecks name it.
MULTIKUEUE_CONFIG = "fakefleet"


class MultiKueueSpec(Model):
    """This cluster as a MultiKueue manager: the worker FakeClusters it dispatches Jobs to."""

    workers: list[str] = Field(
        min_length=1, max_length=MAX_MULTIKUEUE_WORKERS,
        json_schema_extra={"x-kubernetes-list-type": "set",
                           "items": {"type": "string", "maxLength": LABEL_VALUE_MAX_LENGTH,
                                     "pattern": CLUSTER_NAME_PATTERN}})
    """Names of FakeClusters in the same namespace (each with spec.addons.kueue enabled): the
    operator keeps a kubeconfig Secret, a MultiKueueCluster per worker and the MultiKueueConfig
    'fakefleet' listing them in this cluster's kueue-system namespace."""
    workerLostTimeout: str = Field(default="30s", pattern=DURATION_PATTERN,
                                   max_length=DURATION_LENGTH)
    """How long Kueue waits for a worker that stopped answering before it dispatches the
    worker's admitted Workloads elsewhere (Kueue's multiKueue.workerLostTimeout; its own default
    of 15m is long for a simulation)."""


class KueueSpec(Model):
    """Run the real Kueue controller (with MultiKueue) against this cluster's API server."""

    enabled: bool = True
    """false: Kueue stops and its webhooks are removed (its CRDs and your queues stay)."""
    multiKueue: MultiKueueSpec | None = None
    """Make this cluster a MultiKueue manager of the listed worker clusters."""


#: Karpenter's zones unless spec.addons.karpenter.zones says otherwise.
DEFAULT_ZONES = ("zone-a", "zone-b", "zone-c")
MAX_ZONES = 16

#: metrics-server refuses to scrape more often than this.
MIN_METRIC_RESOLUTION = "10s"


class MetricsServerSpec(Model):
    """The real metrics-server against this cluster: it scrapes the engine's fake kubelets and
    serves metrics.k8s.io through the API server's aggregation layer, for kubectl top and
    HorizontalPodAutoscalers. On by default for backend 'local'."""

    enabled: bool = True
    """false: metrics-server stops and its APIService is removed."""
    resolution: str = Field(default="15s", pattern=DURATION_PATTERN, max_length=DURATION_LENGTH,
                            json_schema_extra=validations(rule(
                                f"duration(self) >= duration('{MIN_METRIC_RESOLUTION}')",
                                f"metrics-server scrapes at most every "
                                f"{MIN_METRIC_RESOLUTION}: give a resolution of "
                                f"{MIN_METRIC_RESOLUTION} or more, e.g. 15s")))
    """How often it scrapes every node (its --metric-resolution), at least 10s; kubectl top and
    HPAs see a change of usage within one or two of these."""


#: Prometheus scrapes at least this often, and at most this often.
MIN_SCRAPE_INTERVAL, MAX_SCRAPE_INTERVAL = "1s", "5m"
#: Prometheus keeps samples at least this long, and at most this long.
MIN_RETENTION, MAX_RETENTION = "10m", "720h"
#: Metrics the adapter may be limited to.
MAX_CUSTOM_METRICS = 64


class CustomMetricsSpec(Model):
    """HorizontalPodAutoscalers on application metrics (type Pods), through the path a platform
    team runs: Prometheus (v3.16.0) scrapes the pods' metrics, which the engine serves from
    their fakefleet.dev/metric.<name> annotations, and fakefleet's custom-metrics adapter (on
    sigs.k8s.io/custom-metrics-apiserver, as prometheus-adapter is) serves them as
    custom.metrics.k8s.io through the API server's aggregation layer. Prometheus scrapes a
    pod that has the annotation prometheus.io/scrape: "true", or an annotation of a metric
    listed in metrics."""

    enabled: bool = True
    """false: Prometheus and the adapter stop, and the adapter's APIServices are removed."""
    scrapeInterval: str = Field(
        default="5s", pattern=DURATION_PATTERN, max_length=DURATION_LENGTH,
        json_schema_extra=validations(rule(
            f"duration(self) >= duration('{MIN_SCRAPE_INTERVAL}') && "
            f"duration(self) <= duration('{MAX_SCRAPE_INTERVAL}')",
            f"give a scrapeInterval from {MIN_SCRAPE_INTERVAL} to {MAX_SCRAPE_INTERVAL}, "
            f"e.g. 5s")))
    """How often Prometheus scrapes each pod: an HPA sees a metric's change within this plus
    its controller's sync period (5s)."""
    retention: str = Field(
        default="2h", pattern=DURATION_PATTERN, max_length=DURATION_LENGTH,
        json_schema_extra=validations(rule(
            f"duration(self) >= duration('{MIN_RETENTION}') && "
            f"duration(self) <= duration('{MAX_RETENTION}')",
            f"give a retention from {MIN_RETENTION} to {MAX_RETENTION}, e.g. 2h")))
    """How long Prometheus keeps samples (in the cluster's state directory; at most 256MiB
    whatever this says)."""
    metrics: list[Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)]] = \
        Field(default_factory=list, max_length=MAX_CUSTOM_METRICS,
              json_schema_extra={"x-kubernetes-list-type": "set"})
    """The only metrics the adapter serves and lists (names as in the pods' annotations, e.g.
    vllm_num_requests_waiting); Prometheus then also scrapes every pod that has an annotation
    of one of them. Empty: every metric Prometheus has of a pod."""


#: Karpenter's own pattern for consolidateAfter (a Go duration in whole s, m, h, or Never).
CONSOLIDATE_AFTER_PATTERN = r"^(([0-9]+(s|m|h))+|Never)$"
#: Karpenter's pattern for a disruption budget's nodes: a count or a percentage.
BUDGET_PATTERN = r"^((100|[0-9]{1,2})%|[0-9]+)$"


class KarpenterSpec(Model):
    """Karpenter (its KWOK cloud provider) against this cluster: it makes nodes for pods that
    wait and deletes them when consolidation finds them empty or underused; fakefleet's engine
    plays every node it makes. It makes nodes only for FakeNodePools with provisioner
    karpenter, from the NodePool fakefleet writes for each."""

    enabled: bool = True
    """false: Karpenter stops; what it made stays (its NodePools, NodeClaims and nodes, whose
    finalizers wait for it): delete the provisioner pools first."""
    consolidateAfter: str = Field(default="30s", pattern=CONSOLIDATE_AFTER_PATTERN,
                                  max_length=32)
    """How long a node must have had no pod come or go before consolidation may remove or
    replace it (the NodePools' spec.disruption.consolidateAfter), e.g. 30s, 5m, or Never.
    Removing an empty node takes about this plus 30-40 s of Karpenter's own polling and
    validation."""
    consolidationPolicy: Literal["WhenEmptyOrUnderutilized", "WhenEmpty"] = \
        "WhenEmptyOrUnderutilized"
    """Which nodes consolidation considers: empty ones only, or underused ones too (their
    pods moved to cheaper nodes)."""
    disruptionBudget: str = Field(default="10%", pattern=BUDGET_PATTERN, max_length=8)
    """At most how many of a NodePool's nodes consolidation disrupts at once: a count or a
    percentage, rounded up (Karpenter's default, 10%)."""
    nodeRepair: bool = False
    """Karpenter's NodeRepair feature gate: a node NotReady (False or Unknown) for 10 minutes
    is drained and replaced, unless more than 20% of its NodePool is unhealthy. Off, as
    Karpenter has it by default: a faulty node stays until the fault ends."""
    zones: list[Annotated[str, label_value("zone")]] = Field(
        default_factory=lambda: list(DEFAULT_ZONES), min_length=1, max_length=MAX_ZONES,
        json_schema_extra={"x-kubernetes-list-type": "set", "default": list(DEFAULT_ZONES)})
    """Zones every instance type is offered in (topology.kubernetes.io/zone of the nodes);
    a provisioner pool's topology.zones must be among them."""


class KubeRaySpec(Model):
    """KubeRay's operator against this cluster: it makes the head and worker pods of every
    RayCluster, which the engine runs, and its webhook validates RayClusters. ``{}`` turns it
    on."""

    enabled: bool = True
    """false: KubeRay stops and its webhook is removed (its CRDs and your RayClusters stay)."""


class AddonsSpec(Model):
    """Real upstream controllers the operator runs for this cluster, supervised like its control
    plane: started, restarted when they crash, stopped with the cluster."""

    kueue: KueueSpec | None = None
    """Kueue (sigs.k8s.io/kueue v0.17.0), built from the Go module proxy on first use."""
    metricsServer: MetricsServerSpec | None = None
    """metrics-server (sigs.k8s.io/metrics-server v0.8.0); absent: on, as {enabled: true},
    for backend 'local'."""
    karpenter: KarpenterSpec | None = None
    """Karpenter with its KWOK cloud provider (sigs.k8s.io/karpenter v1.14.1), built from the
    Go module proxy on first use (a cold build takes about 17 minutes)."""
    kuberay: KubeRaySpec | None = None
    """KubeRay's operator (github.com/ray-project/kuberay/ray-operator v1.5.0) with its
    webhook, built from the Go module proxy on first use."""
    customMetrics: CustomMetricsSpec | None = None
    """Prometheus (github.com/prometheus/prometheus v0.316.0) and fakefleet's custom-metrics
    adapter, for HPAs on the pods' application metrics; built on first use (a cold build takes
    about 30 minutes)."""


class FakeClusterSpec(Model):
    """Desired state of a FakeCluster."""

    kubernetesVersion: str = Field(
        default=DEFAULT_KUBERNETES_VERSION,
        pattern=r"^v1\.[0-9]+\.[0-9]+$",
        json_schema_extra=validations(immutable(
            "kubernetesVersion is immutable: create a new FakeCluster for another version"
        )),
    )
    """Kubernetes release of the control plane, e.g. v1.36.3 (backend 'local')."""
    controlPlane: ControlPlaneSpec = Field(
        default_factory=ControlPlaneSpec,
        json_schema_extra={"default": ControlPlaneSpec().model_dump(mode="json",
                                                                    exclude_none=True),
                           **validations(immutable(
            "controlPlane is immutable: delete and recreate the FakeCluster to change it"
        ))},
    )
    """The control plane: a local one or an adopted external cluster."""
    labels: Labels = Field(default_factory=dict)
    """Labels for fleet selection (region, zone, provider), used by fault plans and the hub; at
    most 64, keys and values as Kubernetes labels."""
    federation: FederationSpec | None = None
    """The federation hub the cluster joins. Absent: as {enabled: true}, the hub that
    'fakefleet up' started on this host, if there is one."""

    addons: AddonsSpec | None = None
    """Add-ons the operator runs against this cluster (backend 'local' only): kueue,
    metricsServer (on unless disabled), karpenter, kuberay, customMetrics."""

    @property
    def kueue(self) -> KueueSpec | None:
        """spec.addons.kueue when it is enabled, else None."""
        kueue = self.addons.kueue if self.addons else None
        return kueue if kueue is not None and kueue.enabled else None

    @property
    def karpenter(self) -> KarpenterSpec | None:
        """spec.addons.karpenter when it is enabled, else None."""
        karpenter = self.addons.karpenter if self.addons else None
        return karpenter if karpenter is not None and karpenter.enabled else None

    @property
    def kuberay(self) -> KubeRaySpec | None:
        """spec.addons.kuberay when it is enabled, else None."""
        kuberay = self.addons.kuberay if self.addons else None
        return kuberay if kuberay is not None and kuberay.enabled else None

    @property
    def custom_metrics(self) -> CustomMetricsSpec | None:
        """spec.addons.customMetrics when it is enabled, else None."""
        found = self.addons.customMetrics if self.addons else None
        return found if found is not None and found.enabled else None

    @property
    def metrics_server(self) -> MetricsServerSpec | None:
        """spec.addons.metricsServer as it applies (absent: enabled, for backend 'local'), or
        None when it is off."""
        if self.controlPlane.backend != "local":
            return None
        found = (self.addons.metricsServer if self.addons else None) or MetricsServerSpec()
        return found if found.enabled else None

    @property
    def effective_federation(self) -> FederationSpec:
        """spec.federation as it applies: absent is {enabled: true}."""
        return self.federation or FederationSpec()


class FakeClusterStatus(Model):
    """Observed state of a FakeCluster."""

    phase: Literal["Pending", "Provisioning", "Ready", "Failed", "Terminating"] = "Pending"
    """Summary of the conditions."""
    endpoint: str = ""
    """URL of the cluster's API server."""
    kubernetesVersion: str = ""
    """Version the API server reports."""
    kubeconfigSecret: str = ""
    """Name of the Secret (key 'kubeconfig') with an admin kubeconfig of the cluster."""
    dcgmEndpoint: str = ""
    """URL of the cluster's DCGM GPU metrics (dcgm-exporter's names and labels, every node's
    GPUs), served by its engine on this host's loopback; its nodes' kubelet metrics are at
    http://<node InternalIP>:<the same port>/metrics/resource."""
    nodes: int = 0
    """Fake nodes in the cluster."""
    readyNodes: int = 0
    """Fake nodes that are Ready."""
    observedGeneration: int = 0
    """The metadata.generation the status describes."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Reconciling, Stalled."""


class FakeCluster(CustomResource):
    """A simulated Kubernetes cluster: a real control plane whose nodes and pods are fake."""

    resource = ResourceInfo(
        kind="FakeCluster",
        plural="fakeclusters",
        short_names=("fc",),
        printer_columns=(
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Nodes", ".status.nodes", "integer"),
            PrinterColumn("Ready", ".status.readyNodes", "integer"),
            PrinterColumn("Version", ".status.kubernetesVersion"),
            PrinterColumn("Endpoint", ".status.endpoint"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
        rules=(NAME_RULE, KUEUE_LOCAL_RULE, KUEUE_NOT_OWN_WORKER_RULE,
               METRICS_SERVER_LOCAL_RULE, KARPENTER_LOCAL_RULE, KUBERAY_LOCAL_RULE,
               CUSTOM_METRICS_LOCAL_RULE),
    )
    kind: str = "FakeCluster"
    spec: FakeClusterSpec = Field(default_factory=FakeClusterSpec)
    status: FakeClusterStatus | None = None
