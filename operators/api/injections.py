"""How a fault reaches what it acts on: as a fault *entry*, carried by an object the plan
writes.

A FaultPlan never changes a node's or pod's status itself. An entry holds the stages the fault
adds (``stages``) and the stages that undo it (``recovery``); the engine runs the live ones
ahead of the object's default lifecycle, so a fault overrides the lifecycle for as long as it
lasts, through the same interpreter and the same writes as every other stage. An entry's
``state`` says which are live:

- ``inject``: its ``stages`` (written by the plan when it injects);
- ``recover``: its ``recovery`` (the plan flips the state when the fault's duration ends, or
  the plan is deleted);
- ``done``: none; the engine sets it when a stage with ``endFault`` was written on every
  target (a recovery finished, or a one-shot fault such as a container exit happened).

An entry's id is the plan's namespace, name and uid-derived suffix, the step and the
occurrence: writing an entry that is already there (a plan operator restarted between its
write and its status update) changes nothing, so no fault is injected twice.

Entries travel in three kinds of object:

- node and pod faults: a *fault set* in the member (:mod:`operators.api.faultsets`), one per
  step occurrence and cluster, that names its targets; the engine runs the entry on each;
- ``Delete`` of a node: the FakeNodePool in the host cluster lists the node in its
  ``fakefleet.dev/held-nodes`` annotation (``{"<entry id>": ["<node>", ...]}``); its engine
  deletes held nodes and does not make them again until the entry is gone;
- cluster faults, on the FakeCluster. Control-plane faults: it lists the components to stop
  in its ``fakefleet.dev/faults`` annotation (entries with ``stop``); the operator stops them and
  starts them again once no entry in state ``inject`` names them. An entry with ``latency``
  slows the cluster's engine's writes instead (its engine watches its FakeCluster).
  Hub-link faults (HubPartition, HubLatency): the FakeCluster carries an entry with ``hub``
  (``partition``: which way the link loses messages; ``latency``: added to each message, each
  way); the hub link, which runs in the operator for each FakeCluster, obeys
  :func:`hub_link_faults` of the FakeCluster's annotations whenever they change.

FakeCluster entries never reach ``recover`` or ``done``: nothing there is undone stage by
stage, so the plan writes them in state ``inject`` (:func:`inject_entry`) and removes them
(:func:`remove_entry`) when the fault ends (its duration is over, or the plan is deleted).
Their readers obey the entries in state ``inject`` and nothing else; the plan counts such a
fault recovered once its entry is gone (and, for a stopped component, once the component runs
again). Every write of the annotation is conditional on the object's resourceVersion, so
writers never overwrite each other's changes to the list.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, ValidationError

from operators.api.base import Model
from operators.api.durations import DURATION_LENGTH, DURATION_PATTERN, parse_duration
from operators.api.stages import Stage
from primitives import keys

#: A W3C traceparent: version, trace id, span id, flags.
TRACEPARENT_PATTERN = r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"


EntryState = Literal["inject", "recover", "done"]
Component = Literal["kube-apiserver", "kube-scheduler", "kube-controller-manager"]
#: Which way a partitioned hub link loses messages: both ways, what the member sends (toHub),
#: or what the hub sends (fromHub).
HubDirection = Literal["both", "toHub", "fromHub"]


class HubLink(Model):
    """What a hub-link fault does to the FakeCluster's link to its federation hub."""

    partition: HubDirection | None = None
    """HubPartition: the messages that are lost (both ways, toHub or fromHub)."""
    latency: str | None = Field(default=None, pattern=DURATION_PATTERN,
                                 max_length=DURATION_LENGTH)
    """HubLatency: how long each message, either way, waits before it is delivered."""


class FaultEntry(Model):
    """One fault: for each target of a fault set, or on a FakeCluster."""

    id: str = Field(min_length=1)
    state: EntryState = "inject"
    stages: list[Stage] = Field(default_factory=list)
    """Live while the state is inject."""
    recovery: list[Stage] = Field(default_factory=list)
    """Live while the state is recover; the last of them carries endFault."""
    stop: list[Component] = Field(default_factory=list)
    """FakeCluster entries: the control-plane components that stay stopped while the state is
    inject."""
    latency: str | None = Field(default=None, pattern=DURATION_PATTERN,
                                 max_length=DURATION_LENGTH)
    """FakeCluster entries: while the state is inject, the cluster's engine waits this long
    before each of its writes (APIServerSlow)."""
    hub: HubLink | None = None
    """FakeCluster entries: while the state is inject, what happens to the cluster's link to
    its hub (HubPartition, HubLatency)."""
    traceparent: str | None = Field(default=None, pattern=TRACEPARENT_PATTERN)
    """The W3C trace context of the plan step that wrote the entry: the engine's span for
    carrying it out is a child of it, so the fault's writes land in the plan's trace."""

    @property
    def live(self) -> list[Stage]:
        if self.state == "inject":
            return self.stages
        if self.state == "recover":
            return self.recovery
        return []


def read_entries(annotations: Mapping[str, str] | None) -> tuple[list[FaultEntry], str]:
    """The entries an object carries, and a problem ("" when there is none). An annotation that
    cannot be read carries no entries: the problem says why, for a Warning Event."""
    text = (annotations or {}).get(keys.FAULTS)
    if not text:
        return [], ""
    try:
        raw = json.loads(text)
        if not isinstance(raw, list):
            raise ValueError("not a JSON list")
        return [FaultEntry.model_validate(item) for item in raw], ""
    except (ValueError, ValidationError) as error:
        return [], (f"annotation {keys.FAULTS} is not a list of fault entries ({error}); "
                    f"it is ignored")


def render_entries(entries: list[FaultEntry]) -> str | None:
    """The annotation's value (None: remove the annotation)."""
    if not entries:
        return None
    return json.dumps([entry.model_dump(mode="json", exclude_defaults=True, by_alias=True)
                       | {"id": entry.id, "state": entry.state} for entry in entries],
                      separators=(",", ":"))


# -- a FakeCluster entry's life ------------------------------------------------------------------

def inject_entry(entries: list[FaultEntry], entry: FaultEntry) -> list[FaultEntry]:
    """``entries`` with ``entry`` added, unless one with its id is there already: written before
    a restart, it stays as it was (its trace included), so no fault is injected twice."""
    if any(e.id == entry.id for e in entries):
        return entries
    return [*entries, entry]


def remove_entry(entries: list[FaultEntry], entry_id: str) -> list[FaultEntry]:
    """``entries`` without entry ``entry_id``: a FakeCluster's whose fault ended."""
    return [e for e in entries if e.id != entry_id]


def write_latency(annotations: Mapping[str, str] | None) -> float:
    """Seconds a FakeCluster's entries add to each write of its engine (the largest)."""
    entries, _ = read_entries(annotations)
    return max((parse_duration(entry.latency) for entry in entries
                if entry.state == "inject" and entry.latency), default=0.0)


@dataclasses.dataclass(frozen=True)
class HubLinkFaults:
    """What a FakeCluster's entries do to its hub link now (nothing, by default)."""

    #: What the member sends to the hub is lost.
    to_hub_dropped: bool = False
    #: What the hub sends to the member is lost.
    from_hub_dropped: bool = False
    #: Seconds each message waits before it is delivered, either way (the largest of the
    #: entries: latencies of faults that overlap do not add up).
    latency: float = 0.0


def hub_link_faults(annotations: Mapping[str, str] | None) -> HubLinkFaults:
    """What the entries in state inject of a FakeCluster's annotations do to its hub link; an
    annotation that cannot be read does nothing (:func:`read_entries` says why)."""
    entries, _ = read_entries(annotations)
    links = [entry.hub for entry in entries if entry.state == "inject" and entry.hub]
    return HubLinkFaults(
        to_hub_dropped=any(link.partition in ("both", "toHub") for link in links),
        from_hub_dropped=any(link.partition in ("both", "fromHub") for link in links),
        latency=max((parse_duration(link.latency) for link in links if link.latency),
                    default=0.0))


def read_held(annotations: Mapping[str, str] | None) -> dict[str, list[str]]:
    """The nodes a FakeNodePool holds deleted, by entry id (an unreadable value holds none)."""
    text = (annotations or {}).get(keys.HELD_NODES)
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(key): [str(name) for name in value] for key, value in raw.items()
            if isinstance(value, list)}


def render_held(held: Mapping[str, list[str]]) -> str | None:
    kept = {key: sorted(names) for key, names in held.items() if names}
    return json.dumps(kept, separators=(",", ":"), sort_keys=True) if kept else None


def hold_node(held: Mapping[str, list[str]], entry_id: str, node: str) -> dict[str, list[str]]:
    """``held`` with ``node`` held deleted by entry ``entry_id``."""
    return {**held, entry_id: sorted({*held.get(entry_id, ()), node})}


def release_node(held: Mapping[str, list[str]], entry_id: str,
                 node: str) -> dict[str, list[str]]:
    """``held`` without ``node`` among those entry ``entry_id`` holds."""
    return {**held, entry_id: sorted(set(held.get(entry_id, ())) - {node})}
