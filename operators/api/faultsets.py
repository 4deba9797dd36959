"""Fault sets: how a node or pod fault reaches all of a step's targets in a member with one
write. Pure: the format, the names, the chunks and the state changes.

A FaultPlan never changes a node's or pod's status itself, and it does not write to the
victims either. For each occurrence of a step and each member cluster it hits, it writes one
*fault set*: a ConfigMap in the member's namespace ``fakefleet-system``, labelled
``fakefleet.dev/fault-set``, that carries the fault entry
(:class:`~operators.api.injections.FaultEntry`: the stages the fault adds and those that undo
it) and the targets it applies to. The member's engine watches the sets and runs the entry's
stages on every target, ahead of the target's default lifecycle::

    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: fault-0c8f3e0d5a7b9e21d4c6-0
      namespace: fakefleet-system
      labels: {fakefleet.dev/fault-set: 0c8f3e0d5a7b9e21d4c6}
      annotations: {fakefleet.dev/owned-by: FaultPlan/default/xid}
    data:
      id: default/xid-a1b2c3d4/xid/0
      kind: Node                  # or Pod: targets are namespace/name/uid
      state: inject               # inject, recover or done
      traceparent: 00-...-01      # the plan step's span: the engine's writes join its trace
      entries: '[{"stages": [...], "recovery": [...], "targets": ["gpu-0", "gpu-1"]}]'

A fault's stages may depend on the target (how many GPUs a node has, the restart count a
one-shot exit is written for), so ``entries`` holds one entry per distinct stages and the
targets that share them; most sets have one.

The set's ``state`` says which stages are live, as an entry's does: ``inject`` (written so),
``recover`` (:func:`recover_patch`, by the plan when the fault's duration ends or the plan is
deleted), ``done`` (:func:`done_patch`, by the engine once every target ran the stage that
ends the fault in the set's state, or is gone). Each change is conditional on the
resourceVersion it was computed from, so the plan and the engine never overwrite each
other's. The plan deletes a set once it is done (:func:`recovery` says what it owes a set).

Names are derived from the occurrence's entry id (:func:`set_name`): a create retried after a
restart hits the set written before it (409 AlreadyExists), so no fault is written twice. A
set holds at most MAX_TARGETS targets and MAX_TARGET_BYTES of their names (etcd keeps an
object to 1.5 MiB); further targets go to further *chunks* (``-1``, ``-2``...), each a set
with the same id, label and state.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from operators.api.injections import EntryState, FaultEntry
from primitives import keys

#: The member namespace fakefleet owns and keeps its fault sets in.
NAMESPACE = "fakefleet-system"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
#: Who made the namespace (its ``fakefleet.dev/owned-by``): a member's namespace of that name
#: that does not say so is not fakefleet's, and no fault set goes there.
NAMESPACE_WRITER = "fakefleet"
#: Targets one set holds, and bytes of their names (quoted and separated): far under etcd's
#: 1.5 MiB with the entries beside them.
MAX_TARGETS = 5000
MAX_TARGET_BYTES = 512 << 10
#: Characters of the entry id's digest in a set's name and label.
DIGEST = 20

Kind = Literal["Node", "Pod"]


class SetError(ValueError):
    """A ConfigMap labelled as a fault set that is not one; the message says what is wrong."""


@dataclasses.dataclass(frozen=True)
class Group:
    """Targets that share one entry's stages."""

    #: The set's entry for these targets: the set's id, state and traceparent, their stages.
    entry: FaultEntry
    targets: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FaultSet:
    """One fault set as read from its ConfigMap."""

    name: str
    uid: str
    resource_version: str
    #: metadata.creationTimestamp: sets apply in the order they were made.
    created: str
    id: str
    kind: Kind
    state: EntryState
    traceparent: str
    groups: tuple[Group, ...]

    @property
    def targets(self) -> int:
        return sum(len(group.targets) for group in self.groups)


# -- names -----------------------------------------------------------------------------------

def digest(entry_id: str) -> str:
    """The occurrence's label value: every chunk of its sets carries it."""
    return hashlib.sha256(entry_id.encode()).hexdigest()[:DIGEST]


def set_name(entry_id: str, chunk: int) -> str:
    return f"fault-{digest(entry_id)}-{chunk}"


def selector(entry_id: str) -> str:
    """The label selector of the occurrence's sets (all its chunks)."""
    return f"{keys.FAULT_SET}={digest(entry_id)}"


def pod_target(namespace: str, name: str, uid: str) -> str:
    """A pod as a set names it: its uid too, so that a pod made again under the same name (a
    StatefulSet's) never takes the old one's fault."""
    return f"{namespace}/{name}/{uid}"


def pod_uid(target: str) -> str:
    """The uid of a pod target (:func:`pod_target`)."""
    return target.rsplit("/", 1)[-1]


# -- writing ---------------------------------------------------------------------------------

def chunks(targets: Sequence[str], *, most: int = MAX_TARGETS,
           size: int = MAX_TARGET_BYTES) -> list[range]:
    """The positions of ``targets`` each chunk holds, in order: at most ``most`` targets and
    ``size`` bytes of names each. Depends on the targets alone, so a successor that writes the
    same victims again names the same chunks."""
    found: list[range] = []
    start = taken = 0
    for index, target in enumerate(targets):
        cost = len(target.encode()) + 3  # quoted, and a comma
        if index > start and (index - start >= most or taken + cost > size):
            found.append(range(start, index))
            start, taken = index, 0
        taken += cost
    if start < len(targets):
        found.append(range(start, len(targets)))
    return found


def render(entry_id: str, kind: Kind, chunk: int, members: Sequence[tuple[str, FaultEntry]],
           *, traceparent: str = "") -> dict[str, Any]:
    """The ConfigMap of one chunk: ``members`` are its targets, each with the entry it gets
    (targets whose entries have the same stages share one), in state inject."""
    groups: dict[str, dict[str, Any]] = {}
    for target, entry in members:
        stages = entry.model_dump(mode="json", include={"stages", "recovery"},
                                  exclude_defaults=True, by_alias=True)
        key = json.dumps(stages, sort_keys=True)
        groups.setdefault(key, {**stages, "targets": []})["targets"].append(target)
    data = {"id": entry_id, "kind": kind, "state": "inject",
            "entries": json.dumps(list(groups.values()), separators=(",", ":"))}
    if traceparent:
        data["traceparent"] = traceparent
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": set_name(entry_id, chunk), "namespace": NAMESPACE,
                         "labels": {keys.FAULT_SET: digest(entry_id)}},
            "data": data}


# -- reading ---------------------------------------------------------------------------------

def read(obj: Mapping[str, Any]) -> FaultSet:
    """The fault set a ConfigMap holds; SetError says why it holds none."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", ""))
    data = obj.get("data") or {}
    where = f"ConfigMap {NAMESPACE}/{name}"
    entry_id, kind, state = data.get("id"), data.get("kind"), data.get("state")
    if not entry_id:
        raise SetError(f"{where}: data.id is missing: a fault set names its entry")
    if kind not in ("Node", "Pod"):
        raise SetError(f"{where}: data.kind is {kind!r}; a fault set's targets are Node or Pod")
    if state not in ("inject", "recover", "done"):
        raise SetError(f"{where}: data.state is {state!r}; it is one of inject, recover, done")
    traceparent = str(data.get("traceparent") or "")
    try:
        raw = json.loads(data.get("entries") or "[]")
        if not isinstance(raw, list):
            raise ValueError("not a JSON list")
        groups = []
        for item in raw:
            if not isinstance(item, dict):
                raise ValueError("an entry is not a JSON object")
            targets = item.pop("targets", [])
            if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
                raise ValueError("an entry's targets are not a list of names")
            if kind == "Pod" and any(t.count("/") != 2 for t in targets):
                raise ValueError("a pod target is not namespace/name/uid")
            entry = FaultEntry.model_validate({**item, "id": entry_id, "state": state,
                                               "traceparent": traceparent or None})
            groups.append(Group(entry, tuple(targets)))
    except (ValueError, ValidationError) as error:
        raise SetError(f"{where}: data.entries is not a list of fault entries with their "
                       f"targets ({error})") from error
    return FaultSet(name=name, uid=str(metadata.get("uid", "")),
                    resource_version=str(metadata.get("resourceVersion", "")),
                    created=str(metadata.get("creationTimestamp", "")), id=entry_id, kind=kind,
                    state=state, traceparent=traceparent, groups=tuple(groups))


def same_occurrence(written: FaultSet, entry_id: str, kind: Kind) -> bool:
    """Whether a set found under the name of ``entry_id``'s chunk is that occurrence's (written
    before a restart), not another that happens to have the name."""
    return written.id == entry_id and written.kind == kind


# -- its life: every change of state, for the plan and the engine alike -----------------------

def recover_patch(found: FaultSet, traceparent: str = "") -> dict[str, Any] | None:
    """The merge patch that turns ``found`` from inject to its recovery stages, carrying
    ``traceparent`` (none: the one it has); None when it is not in state inject (recovering
    already, or done)."""
    if found.state != "inject":
        return None
    data = {"state": "recover", **({"traceparent": traceparent} if traceparent else {})}
    return {"metadata": {"resourceVersion": found.resource_version}, "data": data}


def done_patch(found: FaultSet, state: EntryState) -> dict[str, Any] | None:
    """The merge patch that marks ``found`` done after every target ran its stages of
    ``state``; None when the set is no longer in that state (the plan turned it meanwhile, or
    it is done)."""
    if found.state != state or state == "done":
        return None
    return {"metadata": {"resourceVersion": found.resource_version}, "data": {"state": "done"}}


Recovery = Literal["gone", "again", "waiting", "over"]


def recovery(sets: Sequence[FaultSet]) -> Recovery:
    """Where the recovery of an occurrence stands in a member, given its sets there: ``gone``
    (none: nothing left to undo), ``again`` (one still inject: its turn to recover was lost,
    to be written again), ``waiting`` (the engine has not finished), ``over`` (all done: to
    be deleted)."""
    if not sets:
        return "gone"
    if any(found.state == "inject" for found in sets):
        return "again"
    return "over" if all(found.state == "done" for found in sets) else "waiting"
