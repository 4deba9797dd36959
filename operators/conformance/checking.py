"""What every check is given and shares: the member cluster's client, its FakeCluster as the
host shows it, a place for evidence, the clock, and the step it is at (so that a deadline that
passes says what it passed during).

A check is ``async def check(ctx) -> Verdict``; it raises :class:`Unmet` with the reason when
the requirement does not hold, and leaves the deadline to :mod:`operators.conformance.running`.
What it creates in the member it registers with :meth:`Context.created`, and the runner
deletes it, whatever the outcome.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from operators.conformance.results import Status
from operators.k8s.client import Client
from primitives.clocks import Clock

T = TypeVar("T")
#: How often a check looks again at what it waits for.
POLL = 1.0


class Unmet(Exception):
    """The requirement does not hold (Not Implemented); the message says what failed and how
    to fix it."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a check that got to its end found."""

    status: Status
    notes: str


class Evidence:
    """The files a check writes under ``DIR/evidence/<id>/``, listed relative to ``DIR``."""

    def __init__(self, root: Path, id: str) -> None:
        self._root = root
        self._folder = Path("evidence") / id
        self.files: list[str] = []

    def write(self, name: str, data: Any) -> None:
        """``data`` as YAML (text as it is) in evidence/<id>/<name>; written again, replaced."""
        path = self._root / self._folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        # Through JSON: API objects as plain mappings and lists, whatever held them.
        text = data if isinstance(data, str) else yaml.safe_dump(
            json.loads(json.dumps(data)), sort_keys=False, width=100)
        path.write_text(text)
        relative = str(self._folder / name)
        if relative not in self.files:
            self.files.append(relative)


@dataclasses.dataclass
class Context:
    """One check's view of the run."""

    member: Client
    host: Client
    cluster: dict[str, Any]
    """The FakeCluster as the host showed it when the run began."""
    pools: list[dict[str, Any]]
    """The FakeNodePools of the cluster."""
    evidence: Evidence
    clock: Clock
    run: str
    """A short name of this run, in the names of what checks create (a rerun never meets
    the leftovers of the one before, still being deleted)."""
    metrics_endpoint: str = ""
    """The DCGM endpoint to read instead of status.dcgmEndpoint (upstream's -metrics-endpoint)."""
    say: Callable[[str], None] = lambda _: None
    step: str = "starting"
    cleanup: list[str] = dataclasses.field(default_factory=list)
    """Paths of what the check created in the member, deleted after it, last first."""

    def at(self, step: str) -> None:
        """The check is now at ``step`` (what a deadline passing names)."""
        self.step = step
        self.say(step)

    def created(self, path: str) -> None:
        self.cleanup.append(path)

    @property
    def name(self) -> str:
        meta = self.cluster["metadata"]
        return f"{meta['namespace']}/{meta['name']}"

    def addon(self, field: str) -> Mapping[str, Any] | None:
        """spec.addons.<field> when it is on, else None."""
        found = ((self.cluster.get("spec") or {}).get("addons") or {}).get(field)
        return found if isinstance(found, Mapping) and found.get("enabled", True) else None

    def condition(self, kind: str) -> Mapping[str, Any]:
        for found in (self.cluster.get("status") or {}).get("conditions") or []:
            if found.get("type") == kind:
                return dict(found)
        return {}

    async def refresh(self) -> None:
        """Read the FakeCluster again (an add-on's condition changes as it comes up)."""
        meta = self.cluster["metadata"]
        self.cluster = await self.host.get(
            f"/apis/fakefleet.dev/v1alpha1/namespaces/{meta['namespace']}/fakeclusters/"
            f"{meta['name']}")

    async def until(self, step: str, probe: Callable[[], Awaitable[T | None]]) -> T:
        """Poll ``probe`` until it returns something other than None or False; the runner's
        deadline bounds the wait."""
        self.at(step)
        while True:
            found = await probe()
            if found is not None and found is not False:
                return found
            await self.clock.sleep(POLL)


async def addon_ready(ctx: Context, field: str, condition: str, how: str) -> Mapping[str, Any]:
    """spec.addons.<field> on and its condition True for the current spec; else Unmet saying
    which, and ``how`` to turn it on."""
    if ctx.addon(field) is None:
        raise Unmet(f"spec.addons.{field} is not enabled on FakeCluster {ctx.name}: {how}")
    async def ready() -> Mapping[str, Any] | None:
        await ctx.refresh()
        found = ctx.condition(condition)
        current = found.get("observedGeneration") in (None, ctx.cluster["metadata"].get(
            "generation"))
        return found if found.get("status") == "True" and current else None
    found = await ctx.until(f"waiting for {condition} of {ctx.name}", ready)
    ctx.evidence.write(f"{condition}.yaml", found)
    return found


def gpus(nodes: list[dict[str, Any]]) -> int:
    """nvidia.com/gpu the nodes offer."""
    return sum(int((n.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", 0))
               for n in nodes)


def provisioner_gpu_pools(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pools whose GPU nodes Karpenter makes as pods need them."""
    return [p for p in pools if p["spec"].get("provisioner") and p["spec"].get("gpu")]


async def require_gpus(ctx: Context) -> list[dict[str, Any]]:
    """The member's nodes, when it has GPUs or a pool that makes GPU nodes; else Unmet."""
    nodes: list[dict[str, Any]] = (await ctx.member.get("/api/v1/nodes"))["items"]
    if gpus(nodes) == 0 and not provisioner_gpu_pools(ctx.pools):
        raise Unmet(f"FakeCluster {ctx.name} has no GPUs: none of its nodes offers "
                    f"nvidia.com/gpu and no pool makes GPU nodes; add a FakeNodePool with "
                    f"spec.gpu (e.g. preset H100-SXM5-80GB)")
    return nodes


def namespace(ctx: Context, id: str) -> str:
    """The namespace a check works in, made for this run."""
    return f"ffc-{ctx.run}-{id.replace('_', '-')}"[:63]


async def make_namespace(ctx: Context, name: str) -> None:
    await ctx.member.create("/api/v1/namespaces", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"fakefleet.dev/conformance": ctx.run}}})
    ctx.created(f"/api/v1/namespaces/{name}")

    async def account() -> bool:
        found = await ctx.member.get(f"/api/v1/namespaces/{name}/serviceaccounts")
        return any(a["metadata"]["name"] == "default" for a in found["items"])
    await ctx.until(f"waiting for the default ServiceAccount of namespace {name}", account)


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def ready(obj: Mapping[str, Any], kind: str = "Ready") -> bool:
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and ready(pod)
