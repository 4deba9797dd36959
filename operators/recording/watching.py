"""Record clusters: list every requested resource of each, watch them from the list's
resourceVersion for the time asked, and stream what :class:`~operators.recording.capturing.
Capture` makes of it into a trace file.

Every cluster and every resource is one list-and-watch (:func:`operators.k8s.watching.
list_and_watch`: a 410 Gone relists, and the capture turns the relist into the changes the
watch missed, without duplicates), all feeding one capture and so one clock. The objects at
the start and the changes go to two unnamed temporary files beside the output as they come;
only the last state of each live object (to compute patches) and the pods' lives stay in
memory. At the end the trace is framed from the two files into the output.

I/O only: what is recorded is :mod:`~operators.recording.capturing`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from operators.k8s.client import Client
from operators.k8s.discovery import group_path
from operators.k8s.errors import K8sError, NotFound
from operators.k8s.times import rfc3339
from operators.k8s.watching import list_and_watch
from operators.recording import files
from operators.recording.capturing import Capture, Watched
from operators.recording.files import Summary, TraceError
from operators.recording.sanitizing import Rules
from operators.recording.trace import Resource
from primitives.clocks import Clock

#: What is recorded unless ``--resources`` says otherwise: the namespaces, the workloads and
#: what they need to run (config, services, disruption budgets, autoscalers, claims). Nodes are
#: left out (a replay's nodes come from its FakeNodePools; their status churns), and so are
#: Events, Leases and EndpointSlices (made by the control plane again on replay).
DEFAULT_RESOURCES = (
    "namespaces", "configmaps", "secrets", "serviceaccounts", "services",
    "persistentvolumeclaims", "pods", "deployments.apps", "replicasets.apps",
    "statefulsets.apps", "daemonsets.apps", "jobs.batch", "cronjobs.batch",
    "poddisruptionbudgets.policy", "horizontalpodautoscalers.autoscaling",
    "priorityclasses.scheduling.k8s.io",
)
#: The version recorded of the built-in groups (others: the group's preferred version, as its
#: discovery says, or the one given as ``plural.group/version``).
VERSIONS = {"": "v1", "apps": "v1", "batch": "v1", "policy": "v1", "autoscaling": "v2",
            "networking.k8s.io": "v1", "scheduling.k8s.io": "v1", "storage.k8s.io": "v1",
            "rbac.authorization.k8s.io": "v1", "coordination.k8s.io": "v1",
            "discovery.k8s.io": "v1", "resource.k8s.io": "v1"}


@dataclasses.dataclass(frozen=True)
class Source:
    """A cluster to record: its name in the trace, and a client of its API server."""

    cluster: str
    client: Client


def parse_resource(text: str) -> tuple[str, str, str | None]:
    """``pods``, ``deployments.apps``, ``widgets.example.com/v1`` as (plural, group,
    version or None); ValueError naming the fix for anything else."""
    name, _, version = text.strip().partition("/")
    plural, _, group = name.partition(".")
    if not plural or not plural.isalnum() or not plural.islower() or (version == "" and "/" in
                                                                       text):
        raise ValueError(f"resource {text!r} is not a plural resource name: give one as "
                         f"kubectl names it, such as 'pods', 'deployments.apps' or "
                         f"'widgets.example.com/v1'")
    return plural, group, version or None


async def resolve(source: Source, names: Sequence[str]) -> list[Watched]:
    """The resources ``names`` on ``source``'s API server, with their kinds; TraceError naming
    the cluster and the resource when it serves no such one."""
    found: list[Watched] = []
    documents: dict[str, dict[str, Any]] = {}
    for text in names:
        try:
            plural, group, version = parse_resource(text)
        except ValueError as error:
            raise TraceError(str(error)) from None
        version = version or VERSIONS.get(group) or await _preferred(source, group, text)
        api_version = f"{group}/{version}" if group else version
        if api_version not in documents:
            try:
                documents[api_version] = await source.client.get(group_path(api_version))
            except NotFound:
                documents[api_version] = {}
        listed = next((r for r in documents[api_version].get("resources") or ()
                       if r.get("name") == plural), None)
        if listed is None:
            raise TraceError(f"cluster {source.cluster} serves no resource {plural} in "
                             f"{api_version} (from --resources {text!r}): 'kubectl "
                             f"api-resources' lists what it serves")
        found.append(Watched(source.cluster, Resource(group, version, plural),
                             str(listed["kind"]), bool(listed.get("namespaced"))))
    return found


async def _preferred(source: Source, group: str, text: str) -> str:
    try:
        document = await source.client.get(f"/apis/{group}")
        return str(document["preferredVersion"]["version"])
    except (NotFound, KeyError, TypeError):
        raise TraceError(f"cluster {source.cluster} serves no API group {group!r} (from "
                         f"--resources {text!r}): 'kubectl api-resources' lists what it "
                         f"serves") from None


def path_of(watched: Watched) -> str:
    return f"{group_path(watched.resource.api_version)}/{watched.resource.resource}"


async def record(sources: Sequence[Source], resources: Mapping[str, Sequence[Watched]], *,
                 output: Path, duration: float, rules: Rules, clock: Clock,
                 progress: Callable[[int, int], None] | None = None,
                 on_listed: Callable[[], None] | None = None) -> Summary:
    """Record ``resources`` of each source for ``duration`` seconds of ``clock`` into the trace
    at ``output``. ``progress(initial, changes)`` is told the counts every second;
    ``on_listed()`` once every resource has been listed (what follows is recorded as
    changes)."""
    started = clock.now()
    capture = Capture(start=started, rules=rules)
    counts = {"initial": 0, "changes": 0}
    unlisted = set(itertools.chain.from_iterable(resources.values()))
    with _spool(output) as initial, _spool(output) as changes:
        def listed(watched: Watched, items: list[Any]) -> None:
            if watched in unlisted:
                unlisted.discard(watched)
                if not unlisted and on_listed is not None:
                    on_listed()
            result = capture.listed(watched, items, clock.now())
            for obj in result.initial:
                initial.write(files.initial_line(watched.cluster, obj))
            for change in result.changes:
                changes.write(files.change_line(change))
            counts["initial"] += len(result.initial)
            counts["changes"] += len(result.changes)

        def event(watched: Watched, kind: str, obj: Any) -> None:
            for change in capture.event(watched, kind, obj, clock.now()):
                changes.write(files.change_line(change))
                counts["changes"] += 1

        clients = {source.cluster: source.client for source in sources}
        tasks = [asyncio.create_task(list_and_watch(
            clients[watched.cluster], path_of(watched), {},
            on_list=functools.partial(listed, watched),
            on_event=functools.partial(event, watched),
            clock=clock), name=f"record {watched.cluster} {watched.resource.resource}")
            for watched in itertools.chain.from_iterable(resources.values())]
        try:
            deadline = started + duration
            while (left := deadline - clock.now()) > 0:
                await clock.sleep(min(1.0, left))
                failed = [task for task in tasks if task.done()]
                if failed:
                    failed[0].result()  # list_and_watch ends only by an error: raise it
                if progress is not None:
                    progress(counts["initial"], counts["changes"])
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, K8sError):
                    await task
        lives = capture.lives()
        summary = Summary(
            clusters=tuple(source.cluster for source in sources), started_at=rfc3339(started),
            duration=capture.at(clock.now()), initial=counts["initial"],
            changes=counts["changes"], pods=len(lives), notes=rules.notes() + tuple(
                f"recorded {', '.join(_named(w) for w in watched)} of cluster {cluster}"
                for cluster, watched in resources.items()))
        lines = itertools.chain(_lines(initial), _lines(changes),
                                (files.pod_line(life) for life in lives))
        files.write_lines(output, summary, lines)
    return summary


def _named(watched: Watched) -> str:
    group = f".{watched.resource.group}" if watched.resource.group else ""
    return f"{watched.resource.resource}{group}"


@contextlib.contextmanager
def _spool(output: Path) -> Iterator[IO[bytes]]:
    """An unnamed private file beside ``output`` (gone when closed, or when we die)."""
    try:
        handle = tempfile.TemporaryFile(dir=output.parent)  # noqa: SIM115 (closed below)
    except OSError as error:
        raise TraceError(f"cannot write beside {output}: {error}: give -o a path in a "
                         f"writable directory") from error
    with handle:
        yield handle


def _lines(handle: IO[bytes]) -> Iterator[bytes]:
    handle.flush()
    handle.seek(0)
    yield from handle
