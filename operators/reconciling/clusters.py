"""What to do about a FakeCluster, and what its status says: pure functions, no I/O.

:func:`plan` compares the desired cluster with what the operator observes (is the control plane
running, is its kubeconfig Secret current, does the engine process run) and returns the actions
that close the gap, in order. :func:`status` summarises the observation as kstatus conditions;
its node counts are what the engine wrote in the pools' statuses (nodes the member API shows
Ready), and each add-on asked for adds its condition (what :mod:`operators.addons` said of it;
the cluster is Ready only once its required add-ons are). The kopf handlers
(:mod:`operators.handlers.clusters`) observe, call these, and apply.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from operators.api.clusters import FakeCluster, FakeClusterStatus
from operators.api.status import condition

Phase = Literal["Pending", "Provisioning", "Ready", "Failed", "Terminating"]


def cluster_key(namespace: str, name: str) -> str:
    """The member's identity in the substrate and the engine fleet (namespaces have no dots)."""
    return f"{namespace}.{name}"


def kubeconfig_secret_name(name: str) -> str:
    return f"{name}-kubeconfig"


@dataclasses.dataclass(frozen=True)
class HubState:
    """The cluster's hub link, as the operator sees it (the HubConnected condition)."""

    connected: bool
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class AddonState:
    """What an add-on's condition says (KueueReady, MetricsServerReady)."""

    ready: bool
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class AddonCondition:
    """An add-on's place in the cluster's status: its condition's type, the name messages give
    it, and whether the cluster is Ready only with it."""

    type: str
    title: str
    #: The cluster is Ready only when this add-on is (Kueue: Jobs wait for its webhooks); the
    #: others only say how they are (kubectl top waits for metrics-server, nothing else does).
    required: bool = False

    @property
    def subject(self) -> str:
        """What the condition is about, in the names made of it: ``KueueReady`` → ``Kueue``
        (the Ready condition's reason ``KueueNotReady``)."""
        return self.type.removesuffix("Ready")


#: The add-ons asked for, each with what its condition says, in the order of their conditions.
Addons = tuple[tuple[AddonCondition, AddonState], ...]


@dataclasses.dataclass(frozen=True)
class Release:
    """The Kubernetes release a local cluster waits for, not in the cache yet: its build."""

    version: str
    #: Seconds its build has run (None: not running).
    building_for: float | None = None
    #: The release being built ahead of it (builds run one at a time).
    waiting_for: str = ""
    #: Why its last build failed (it is tried again later).
    error: str = ""
    #: How long builds of Kubernetes took here (the median, seconds; None: none yet).
    usual: float | None = None


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the operator sees of one member cluster right now."""

    control_plane_running: bool = False
    secret_current: bool = False
    engine_running: bool = False
    endpoint: str = ""
    version: str = ""
    nodes: int = 0
    ready_nodes: int = 0
    error: str = ""
    stalled: bool = False
    hub: HubState | None = None
    #: The conditions of the add-ons the cluster's spec asks for.
    addons: Addons = ()
    #: The engine's DCGM endpoint ("" before it has one).
    dcgm_endpoint: str = ""
    #: The release the spec asks for, while it is not in the cache (None: it is).
    release: Release | None = None


@dataclasses.dataclass(frozen=True)
class StartControlPlane:
    """Start the local control plane (the same ports and data if it ran before)."""


@dataclasses.dataclass(frozen=True)
class BuildRelease:
    """Build the Kubernetes release the spec asks for into the cache, in the background (one
    build at a time, for every cluster that asks for it)."""


@dataclasses.dataclass(frozen=True)
class ConnectExternal:
    """Read the adopted cluster's kubeconfig from its Secret."""

    secret: str
    key: str


@dataclasses.dataclass(frozen=True)
class WriteKubeconfigSecret:
    name: str


@dataclasses.dataclass(frozen=True)
class StartEngine:
    """Start the cluster's engine process (it adopts whatever its predecessor made)."""


@dataclasses.dataclass(frozen=True)
class StopEngine:
    pass


@dataclasses.dataclass(frozen=True)
class DrainNodes:
    """Delete every fake node the engine made (an adopted cluster outlives its FakeCluster);
    after the engine stopped, so nothing makes them again."""


@dataclasses.dataclass(frozen=True)
class RemoveControlPlane:
    """Stop the local control plane and delete its data from etcd."""


Action = (BuildRelease | StartControlPlane | ConnectExternal | WriteKubeconfigSecret
          | StartEngine | DrainNodes | StopEngine | RemoveControlPlane)


def plan(cluster: FakeCluster, observed: Observed, *, deleting: bool = False) -> list[Action]:
    """Actions that bring the member cluster to the desired state (or tear it down)."""
    local = cluster.spec.controlPlane.backend == "local"
    if deleting:
        # A local member's nodes go with its etcd data; an adopted cluster stays, so its fake
        # nodes are deleted first (they would turn NotReady there once the engine stops).
        if local:
            return [StopEngine(), RemoveControlPlane()]
        return [StopEngine(), DrainNodes()]
    actions: list[Action] = []
    release = observed.release
    if local and not observed.control_plane_running and release is not None:
        # Nothing else can start before the binaries are there.
        building = release.building_for is not None or release.waiting_for or release.error
        return [] if building else [BuildRelease()]
    if not observed.control_plane_running:
        if local:
            actions.append(StartControlPlane())
        else:
            ref = cluster.spec.controlPlane.kubeconfigSecretRef
            assert ref is not None, "the CRD's CEL rule requires kubeconfigSecretRef"
            actions.append(ConnectExternal(ref.name, ref.key))
    if local and not observed.secret_current:
        actions.append(WriteKubeconfigSecret(kubeconfig_secret_name(_name(cluster))))
    if not observed.engine_running:
        actions.append(StartEngine())
    return actions


def status(cluster: FakeCluster, observed: Observed, *, now: str,
           previous: FakeClusterStatus | None) -> FakeClusterStatus:
    """The status that describes ``observed`` for the cluster's current generation."""
    generation = int(cluster.metadata.get("generation", 0))
    running = observed.control_plane_running and observed.engine_running
    required = [(addon, state) for addon, state in observed.addons if addon.required]
    waiting = next(((addon, state) for addon, state in required if not state.ready), None)
    ready = running and waiting is None
    phase: Phase
    if ready:
        phase = "Ready"
    elif observed.stalled:
        phase = "Failed"
    elif observed.control_plane_running or observed.error or observed.release is not None:
        phase = "Provisioning"
    else:
        phase = "Pending"
    if ready:
        reason, message = "Running", f"API server at {observed.endpoint}, engine running"
        message += "".join(f", {addon.title} running" for addon, _ in required)
    elif running and waiting is not None and not observed.error:
        addon, state = waiting
        reason, message = f"{addon.subject}NotReady", f"{addon.title}: {state.message}"
    elif observed.release is not None and not observed.error:
        reason, message = building(observed.release)
    elif observed.error:
        reason, message = ("ProvisioningFailed" if observed.stalled else "Provisioning",
                           observed.error)
    else:
        reason, message = "Provisioning", "starting the control plane and the engine"
    earlier = previous.conditions if previous else []
    conditions = [
        condition("Ready", ready, reason=reason, message=message, generation=generation,
                  now=now, previous=earlier),
        condition("Reconciling", not ready and not observed.stalled, reason=reason,
                  message="" if ready else message, generation=generation, now=now,
                  previous=earlier),
        condition("Stalled", observed.stalled, reason=reason if observed.stalled else "",
                  message=observed.error if observed.stalled else "", generation=generation,
                  now=now, previous=earlier),
    ]
    if observed.hub is not None:
        conditions.append(condition(
            "HubConnected", observed.hub.connected, reason=observed.hub.reason,
            message=observed.hub.message, generation=generation, now=now, previous=earlier))
    conditions += [condition(addon.type, state.ready, reason=state.reason, message=state.message,
                             generation=generation, now=now, previous=earlier)
                   for addon, state in observed.addons]
    local = cluster.spec.controlPlane.backend == "local"
    ref = cluster.spec.controlPlane.kubeconfigSecretRef
    return FakeClusterStatus(
        phase=phase,
        endpoint=observed.endpoint,
        kubernetesVersion=observed.version,
        # Named once it holds this cluster's kubeconfig: until then (a user's Secret in its
        # place, say) nobody is to read it as the cluster's.
        kubeconfigSecret=(kubeconfig_secret_name(_name(cluster))
                          if local and observed.secret_current
                          else "" if local else ref.name if ref else ""),
        dcgmEndpoint=observed.dcgm_endpoint,
        nodes=observed.nodes,
        readyNodes=observed.ready_nodes,
        observedGeneration=generation,
        conditions=conditions,
    )


#: What a first build of Kubernetes takes on two cores, before this cache has done one.
COLD_BUILD = "10 to 20 minutes on two cores"


def building(release: Release) -> tuple[str, str]:
    """The reason and message of a cluster whose release is not in the cache yet."""
    what = (f"Kubernetes {release.version} (etcd, kube-apiserver, kube-scheduler, "
            f"kube-controller-manager) from the Go module proxy into the cache")
    usual = (f"builds here took {release.usual / 60:.0f} min" if release.usual is not None
             else f"a first build takes {COLD_BUILD}")
    if release.error:
        return "BuildFailed", (f"building {what} failed, trying again in a few minutes: "
                               f"{release.error}")
    if release.waiting_for:
        return "Building", (f"waiting to build {what}: Kubernetes {release.waiting_for} is "
                            f"being built first (one build at a time; {usual})")
    so_far = (f"{release.building_for / 60:.0f} min so far; "
              if release.building_for is not None else "")
    return "Building", f"building {what}: {so_far}{usual}"


def _name(cluster: FakeCluster) -> str:
    name: str = cluster.metadata["name"]
    return name
