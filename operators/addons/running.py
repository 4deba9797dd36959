"""Add-ons as a protocol: what each one is (:class:`Addon`), and the one machinery that runs
every one of them on the members (:class:`Runner`).

An add-on is a package under ``operators/addons/<name>/``: its binary (a GoTool), its manifests,
its pure rendering and planning, and a class of the :class:`Addon` protocol that observes what
is its own and sets a member up, hooks it into the member and unhooks it. The :class:`Runner`
does what is the same for all: the one background build of the binary, the add-on's process on
each member (supervised: restarted with back-off when it crashes), the observe → plan → act
loop, starting and stopping, its condition in the cluster's status and its line in
``fakefleet status``.

An add-on writes its objects into the member by name (its CRDs, RBAC, webhooks, Service,
APIService, MultiKueue objects), each marked as its own (:func:`owner`): one that a user made
there first is left untouched, and the add-on's condition says ``NotOwned``, naming it.

Under the daemon of ``fakefleet up`` a process outlives the operator (it is detached to the
daemon, :mod:`~operators.controlplane.detaching`): the next operator sets the member up again
(applying its objects is idempotent, server-side apply), adopts the running process if it was
started as it would start it now and answers its probe, and hooks it again. Without a daemon
it dies with the operator, and the next one finds the add-on's files (the same ports and
certificates) and starts it again. Either way nothing is lost or doubled.

This module never imports the kopf glue: what an add-on works with (the state directory, the
host's client, the member's control plane) comes in a :class:`Site`, from
:mod:`operators.handlers.addons`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from operators.addons.building import ToolBuild
from operators.addons.lifecycle import Build, Hook, Observed, Start, Step, Stop
from operators.api.clusters import FakeCluster
from operators.controlplane import health
from operators.controlplane.detaching import record_path, running_as_recorded
from operators.controlplane.errors import AddonError, ControlPlaneError
from operators.controlplane.limits import check_inotify
from operators.controlplane.state import ComponentState, StateDir
from operators.controlplane.substrate import LocalCluster
from operators.controlplane.supervising import Supervised
from operators.controlplane.tools import Tool
from operators.k8s import owning
from operators.k8s.applying import collection_path
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError, NotOwned, brief
from operators.reconciling.clusters import AddonCondition, AddonState
from primitives.files import write_private

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

logger = logging.getLogger(__name__)

#: An add-on that ran this long is healthy: its next crash restarts it after the shortest wait.
STABLE_AFTER = 60.0

ObservedT = TypeVar("ObservedT", bound=Observed)  # what an add-on observes of itself
ActionT = TypeVar("ActionT")  # an add-on's own actions, beyond the lifecycle's steps


@dataclasses.dataclass(frozen=True)
class Site:
    """Where an add-on runs: one member, and what reaches it."""

    key: str
    state: StateDir
    host: Client
    local: LocalCluster | None
    """The member's local control plane; None while it has none."""
    subreaper: int | None = None
    """The child subreaper the add-on's process is detached to (None: it dies with the
    operator)."""

    def control_plane(self) -> LocalCluster:
        if self.local is None:
            raise AddonError("the member's control plane is not running")
        return self.local

    def connect(self) -> Client:
        """A client of the member's API server, as its admin (who installs the add-on)."""
        return Client.connect(load_kubeconfig_file(self.control_plane().kubeconfig_path),
                              connections=4, timeout=30)


@dataclasses.dataclass(frozen=True)
class Files:
    """An add-on of one member in the state directory, ``<state>/clusters/<key>/<name>/``: the
    directory exists while the add-on is set up there."""

    directory: Path

    @classmethod
    def of(cls, state: StateDir, key: str, name: str) -> Self:
        return cls(state.cluster(key) / name)

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.directory / "pki"

    @property
    def log(self) -> Path:
        return self.directory / f"{self.directory.name}.log"

    @property
    def ports(self) -> Path:
        """The loopback ports an add-on listens on, kept so that what points at them (its
        webhook configurations, its scrape targets) stays right across restarts."""
        return self.directory / "ports.json"


PortsT = TypeVar("PortsT", bound="DataclassInstance")


def stored_ports(files: Files, kind: Callable[..., PortsT]) -> PortsT | None:
    """The ports ``files`` keeps, as ``kind``; None when there are none or they cannot be read."""
    try:
        return kind(**json.loads(files.ports.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kept_ports(files: Files, kind: Callable[..., PortsT], new: Callable[[], PortsT]) -> PortsT:
    """The ports it had before, else ``new()`` ones, written before they are used."""
    found = stored_ports(files, kind)
    if found is not None:
        return found
    ports = new()
    write_private(files.ports, (json.dumps(dataclasses.asdict(ports), indent=2) + "\n").encode())
    return ports


@dataclasses.dataclass
class Instance:
    """One member's add-on process, as this operator started it; forgotten when it stops."""

    process: Supervised
    settings: str = ""
    """What it was started with that a change of the spec restarts it for (metrics-server's
    resolution)."""
    hooked: bool = False
    """Its hooks were applied since it started."""
    applied: str = ""
    """Fingerprint of the objects last applied through it (a Kueue manager's MultiKueue)."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """How to start an add-on on a member that :meth:`Addon.setup` made ready for it."""

    argv: list[str]
    settings: str = ""
    """See :attr:`Instance.settings`."""
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Its environment, on top of the operator's (Karpenter takes its settings there)."""


class Addon(Protocol[ObservedT, ActionT]):
    """One add-on: what is its own. ``plan`` and ``state`` are pure; the rest does I/O."""

    name: str
    """Its process (``<key>/<name>``), its directory in the member's state, its log lines."""
    @property
    def tool(self) -> Tool:
        """Its binary: built with ``go install`` from the Go module proxy, or with ``go build``
        from fakefleet's own source."""
    condition: AddonCondition
    """Its condition in the cluster's status."""
    hooks: str
    """What its hooks into the member are, for messages (``webhooks``, ``APIService``)."""

    def wanted(self, cluster: FakeCluster) -> bool:
        """Whether the cluster's spec asks for it."""

    def files(self, state: StateDir, key: str) -> Files:
        """Its files on the member ``key`` (a :class:`Files` with its own besides)."""

    async def observe(self, site: Site, cluster: FakeCluster, lifecycle: Observed,
                      instance: Instance | None) -> ObservedT:
        """``lifecycle``, what the runner saw, with what the add-on sees itself (its health
        probes, its log while it does not answer, what it applied)."""

    def plan(self, cluster: FakeCluster, observed: ObservedT) -> Sequence[Step | ActionT]:
        """The actions that bring it to the spec (:func:`operators.addons.lifecycle.plan`
        first)."""

    def state(self, cluster: FakeCluster, observed: ObservedT) -> AddonState | None:
        """What its condition says; None when the spec does not ask for it."""

    async def setup(self, site: Site, cluster: FakeCluster, binary: Path) -> Launch:
        """Make the member ready for it (its files, certificates, CRDs, RBAC), and say how to
        start it."""

    async def hook(self, site: Site) -> None:
        """Point the member at it, once it serves."""

    async def unhook(self, site: Site) -> None:
        """Remove from the member what points at it."""

    async def act(self, site: Site, cluster: FakeCluster, action: ActionT,
                  instance: Instance) -> None:
        """One of its own actions."""

    def endpoint(self, state: StateDir, key: str) -> tuple[int, str] | None:
        """Its port and health URL on the member ``key``, for ``fakefleet status``."""


class Runner(Generic[ObservedT, ActionT]):
    """One add-on as the operator runs it: its background build, its instance on each member.
    All of it is observed again (or redone, idempotently) after a restart."""

    def __init__(self, addon: Addon[ObservedT, ActionT]) -> None:
        self.addon = addon
        self.build = ToolBuild(addon.tool.title, addon.tool.find, addon.tool.ensure)
        self.instances: dict[str, Instance] = {}

    async def reconcile(self, site: Site, cluster: FakeCluster, *,
                        control_plane_running: bool) -> AddonState | None:
        """Bring the add-on on the member to its spec; its condition (None: not asked for)."""
        if not self.addon.wanted(cluster) and site.key not in self.instances \
                and not self.addon.files(site.state, site.key).directory.exists():
            return None  # the common case: not asked for, nothing to observe
        observed = await self.observe(site, cluster, control_plane_running)
        actions = self.addon.plan(cluster, observed)
        failure = ""
        for action in actions:
            logger.info("cluster %s: %s: %s", site.key, self.addon.name, self._named(action))
            try:
                await self.execute(site, cluster, action)
            except NotOwned as error:
                logger.warning("cluster %s: %s: %s", site.key, self.addon.name, error)
                return AddonState(False, "NotOwned",
                                  brief(f"{self._named(action)} refused: {error}"))
            except (ControlPlaneError, K8sError, OSError) as error:
                failure = brief(f"{self._named(action)} failed: {error}")
                logger.warning("cluster %s: %s: %s", site.key, self.addon.name, failure)
                break
        if actions:
            observed = await self.observe(site, cluster, control_plane_running)
        state = self.addon.state(cluster, observed)
        if state is not None and failure:
            return AddonState(False, "SetupFailed", failure)
        return state

    async def observe(self, site: Site, cluster: FakeCluster,
                      control_plane_running: bool) -> ObservedT:
        binary, build_error, building_for = self.build.observe()
        instance = self.instances.get(site.key)
        return await self.addon.observe(site, cluster, Observed(
            control_plane_running=control_plane_running,
            binary=binary,
            building_for=building_for,
            build_error=build_error,
            installed=self.addon.files(site.state, site.key).directory.exists(),
            supervised=instance is not None,
            hooked=instance is not None and instance.hooked,
            restarts=instance.process.restarts if instance is not None else 0,
        ), instance)

    async def execute(self, site: Site, cluster: FakeCluster, action: Step | ActionT) -> None:
        if isinstance(action, Build):
            self.build.start()
        elif isinstance(action, Start):
            await self.start(site, cluster)
        elif isinstance(action, Hook):
            instance = self.instances[site.key]
            await self.addon.hook(site)
            instance.hooked = True
        elif isinstance(action, Stop):
            await self.stop(site, unhook=action.unhook)
        else:
            await self.addon.act(site, cluster, action, self.instances[site.key])

    async def start(self, site: Site, cluster: FakeCluster) -> None:
        """Set the member up for the add-on and start it; its hooks follow once it serves.
        One that an earlier operator left running as it would start now, and that answers,
        is adopted instead, and hooked again at once (it serves)."""
        site.control_plane()
        tool = self.addon.tool
        binary = tool.find()
        if binary is None:
            raise AddonError(f"the {tool.title} binary is not in the cache: it is being built")
        log = self.addon.files(site.state, site.key).log
        if not running_as_recorded(record_path(log)):  # one that runs holds its instances
            await asyncio.to_thread(check_inotify, f"{tool.title} on {site.key}",
                                    [self.addon.name])
        launch = await self.addon.setup(site, cluster, binary)
        process = Supervised(f"{site.key}/{self.addon.name}", launch.argv, log_path=log,
                             stable_after=STABLE_AFTER, subreaper=site.subreaper,
                             env=launch.env)
        endpoint = self.addon.endpoint(site.state, site.key)
        if endpoint is not None and await health.adopt(
                process, endpoint[1], health.insecure_tls() if endpoint[1].startswith("https")
                else None):
            self.instances[site.key] = Instance(process, settings=launch.settings)
            await self.addon.hook(site)
            self.instances[site.key].hooked = True
            return
        await process.start()
        self.instances[site.key] = Instance(process, settings=launch.settings)

    async def stop(self, site: Site, *, unhook: bool = False) -> None:
        """Stop the add-on; with ``unhook``, remove its hooks, and only then its files: until
        that succeeded they say that there is something left to undo (after a restart too).
        Without, as when the member goes: its hooks go with the member's data."""
        instance = self.instances.pop(site.key, None)
        if instance is not None:
            await instance.process.stop()
        if not unhook:
            return
        if site.local is None or not site.local.apiserver.running:
            raise AddonError(f"{self.addon.tool.title} stopped, but its {self.addon.hooks} "
                             f"cannot be removed while the cluster's API server is down; "
                             f"trying again")
        await self.addon.unhook(site)
        shutil.rmtree(self.addon.files(site.state, site.key).directory, ignore_errors=True)

    async def stop_all(self) -> None:
        """The operator is going: every member's process stops (its files stay)."""
        for instance in self.instances.values():
            await instance.process.stop()
        self.instances.clear()

    def components(self, state: StateDir) -> list[ComponentState]:
        """Each member's process, as ``fakefleet status`` lists it."""
        found = []
        for key, instance in self.instances.items():
            endpoint = self.addon.endpoint(state, key)
            if endpoint is None:
                continue
            port, health_url = endpoint
            found.append(ComponentState(
                cluster=key, name=self.addon.name, pid=instance.process.pid, port=port,
                healthUrl=health_url, log=str(self.addon.files(state, key).log),
                restarts=instance.process.restarts))
        return found

    def _named(self, action: Step | ActionT) -> str:
        """How logs and messages name an action: a step with the add-on's name (StartKueue,
        HookMetricsServer), its own actions as they are (ApplyMultiKueue)."""
        name = type(action).__name__
        return name + self.addon.condition.subject if isinstance(action, Step) else name


def owner(name: str, field_manager: str) -> owning.Owner:
    """The add-on ``name`` as the writer of its objects in a member: what it applied before
    the ownership marker existed carries its field manager, or fakefleet's managed-by label."""
    return owning.Owner(f"Addon/{name}", legacy=owning.any_of(
        owning.field_manager(field_manager),
        owning.labelled("app.kubernetes.io/managed-by", "fakefleet")))


async def apply(client: Client, obj: dict[str, Any], *, plurals: Mapping[str, str],
                field_manager: str, owner: owning.Owner) -> Any:
    """Server-side apply of one of an add-on's objects to the member, as its field manager;
    ``plurals`` names the collection of each kind it applies. NotOwned when an object that
    ``owner`` did not make stands there."""
    path = f"{collection_path(obj, plurals[obj['kind']])}/{obj['metadata']['name']}"
    return await owning.server_side_apply(client, path, obj, owner=owner,
                                          field_manager=field_manager)
