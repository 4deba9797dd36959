"""KWOK's recording format (``kwokctl snapshot record``), read into a trace and written from
one where the content fits.

KWOK v0.8.0 writes a YAML stream: the objects at the start, then one ``ResourcePatch``
(``action.kwok.x-k8s.io/v1alpha1``, ``pkg/apis/action/v1alpha1/resource_patch_types.go``) per
change::

    apiVersion: action.kwok.x-k8s.io/v1alpha1
    kind: ResourcePatch
    resource: {group: apps, version: v1, resource: deployments}
    target: {name: web, namespace: default}
    durationNanosecond: 2000000000       # since the recording started
    method: patch                        # create | patch | delete
    template: {spec: {replicas: 3}}      # create: the object; patch: a strategic-merge patch

Reading: its patches are strategic-merge patches (``CreateTwoWayMergePatch``), which the API
server refuses for custom resources; each is applied to the object as the recording had it
(its start, its create, its patches before) and turned into the merge patch between the two
states (:mod:`~operators.recording.patches`). A patch of an object the recording never showed
is taken with its directives dropped and its lists whole, and the trace's notes say so. KWOK's
recording has no clusters (the one it holds is named by the caller), no start time and no pod
lives: the start is estimated from the objects' creation stamps, and the pods' lives read from
their recorded states (:mod:`~operators.recording.podlives`), as the notes say.

Writing: one cluster's initial objects and changes; a merge patch is said as a strategic-merge
patch with the same effect (a list under a merge key replaced whole with ``$patch: replace``).
What a KWOK file cannot hold is lost and listed by :func:`losses`: pod lives, the other
clusters of a fleet trace, the start time and the notes.

Pure: text in, text out.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import yaml

from operators.k8s.times import parse, rfc3339
from operators.recording import patches, podlives
from operators.recording.files import TraceError
from operators.recording.sanitizing import SERVER_METADATA
from operators.recording.trace import Change, PodLife, Resource, Target, Trace

NANOS = 1_000_000_000

API_VERSION = "action.kwok.x-k8s.io/v1alpha1"
KIND = "ResourcePatch"
METHODS = ("create", "patch", "delete")

_Key = tuple[str, str, str, str]  # (apiVersion, kind or plural, namespace, name)


def looks_like(data: bytes) -> bool:
    """Whether ``data`` may be a KWOK recording (YAML text, not a framed file)."""
    return not data.startswith(b"fakefleet-") and b"\x00" not in data[:4096]


def read(text: str, *, source: str, cluster: str) -> Trace:
    """The trace of the KWOK recording ``text`` (``source`` names it in errors), its objects
    and changes in ``cluster``."""
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise TraceError(f"{source} is neither a fakefleet trace nor KWOK's YAML ({error}): "
                         f"give a file that 'fakefleet record' or 'kwokctl snapshot record' "
                         f"wrote") from error
    plurals = _plurals(documents)
    state: dict[_Key, dict[str, Any]] = {}
    initial: list[tuple[str, dict[str, Any]]] = []
    changes: list[Change] = []
    blind = 0
    for number, doc in enumerate(documents, start=1):
        where = f"{source}, document {number}"
        if not isinstance(doc, dict):
            raise TraceError(f"{where} is not an object: a KWOK recording holds objects and "
                             f"ResourcePatch entries")
        if doc.get("kind") == KIND and doc.get("apiVersion") == API_VERSION:
            change, before_known = _change(doc, where=where, cluster=cluster, state=state)
            blind += not before_known
            changes.append(change)
            continue
        api_version, kind = doc.get("apiVersion"), doc.get("kind")
        name = (doc.get("metadata") or {}).get("name")
        if not api_version or not kind or not name:
            raise TraceError(f"{where} lacks apiVersion, kind or metadata.name: every object "
                             f"of a recording has them")
        obj = _trimmed(doc)
        state[_key_of(str(api_version), plurals.get((str(api_version), str(kind)),
                                                    _plural(str(kind))), obj)] = obj
        initial.append((cluster, obj))
    start = _start(documents)
    lives = _lives(documents, cluster, start) if start is not None else ()
    notes = ["read from KWOK's recording format: " + (
        "its start estimated from the objects' creation stamps (whole seconds), and the pods' "
        "lives from their recorded status" if start is not None else
        "no creation stamps, so no start time and no pod lives")]
    if blind:
        notes.append(f"{blind} strategic-merge patches of objects the recording did not show "
                     f"were taken with their directives dropped and their lists whole")
    return Trace(clusters=(cluster,), started_at=rfc3339(start) if start is not None else "",
                 duration=max((c.at for c in changes), default=0), initial=tuple(initial),
                 changes=tuple(sorted(changes, key=lambda c: c.at)), pods=lives,
                 notes=tuple(notes))


def _start(documents: list[Any]) -> float | None:
    """When the recording started (seconds since the epoch), as its objects' creation stamps
    bound it: an object at the start was created before it, one created ``d`` into it at most
    ``d`` after it (stamps are whole seconds, rounded down), so each gives a lower bound and
    the latest is the best. None without any stamp."""
    bounds = []
    for doc in documents:
        if not isinstance(doc, dict):
            continue
        patch = doc.get("kind") == KIND and doc.get("apiVersion") == API_VERSION
        obj = doc.get("template") if patch and doc.get("method") == "create" else (
            None if patch else doc)
        stamp = ((obj or {}).get("metadata") or {}).get("creationTimestamp") \
            if isinstance(obj, dict) else None
        if isinstance(stamp, str):
            try:
                bounds.append(parse(stamp) - (int(doc.get("durationNanosecond") or 0) / NANOS
                                              if patch else 0))
            except ValueError:
                continue
    return max(bounds, default=None)


def _lives(documents: list[Any], cluster: str, start: float) -> tuple[PodLife, ...]:
    """The pods' lives, from each pod's states as the recording had them (untrimmed: the
    stamps are in their metadata and status)."""
    states: dict[tuple[str, str], dict[str, Any]] = {}
    lives: dict[tuple[str, ...], PodLife] = {}
    for doc in documents:
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == KIND and doc.get("apiVersion") == API_VERSION:
            resource, target = doc.get("resource") or {}, doc.get("target") or {}
            if resource.get("group") or resource.get("resource") != "pods" or \
                    not isinstance(doc.get("template"), dict):
                continue
            key = (str(target.get("namespace") or ""), str(target.get("name")))
            states[key] = doc["template"] if doc.get("method") == "create" else \
                patches.apply_strategic(states.get(key, {}), doc["template"])
        elif doc.get("kind") == "Pod" and doc.get("apiVersion") == "v1":
            metadata = doc.get("metadata") or {}
            key = (str(metadata.get("namespace") or ""), str(metadata.get("name")))
            states[key] = doc
        else:
            continue
        pod = states[key]
        metadata = pod.get("metadata") or {}
        ident = (str(metadata.get("uid") or metadata.get("creationTimestamp")), *key)
        lives[ident] = podlives.life(cluster, {**pod, "metadata": {
            "namespace": key[0], "name": key[1], **metadata}}, start=start,
            seen=lives.get(ident))
    return podlives.numbered(lives.values())


def _change(doc: dict[str, Any], *, where: str, cluster: str,
            state: dict[_Key, dict[str, Any]]) -> tuple[Change, bool]:
    resource, target = doc.get("resource") or {}, doc.get("target") or {}
    method, at = doc.get("method"), doc.get("durationNanosecond")
    if method not in METHODS:
        raise TraceError(f"{where}: method {method!r} is none of {', '.join(METHODS)}")
    if not isinstance(at, int) or isinstance(at, bool) or at < 0:
        raise TraceError(f"{where}: durationNanosecond {at!r} is not a whole number of "
                         f"nanoseconds from 0")
    if not resource.get("version") or not resource.get("resource") or not target.get("name"):
        raise TraceError(f"{where}: resource.version, resource.resource and target.name are "
                         f"required")
    kept = Resource(str(resource.get("group") or ""), str(resource["version"]),
                    str(resource["resource"]))
    place = Target(cluster, kept, str(target.get("namespace") or ""), str(target["name"]))
    key = (kept.api_version, kept.resource, place.namespace, place.name)
    template = doc.get("template")
    if isinstance(template, str):
        try:
            template = json.loads(template)
        except ValueError as error:
            raise TraceError(f"{where}: template is not JSON ({error})") from error
    if method == "delete":
        state.pop(key, None)
        return Change(at, "delete", place), True
    if not isinstance(template, dict):
        raise TraceError(f"{where}: a {method} needs a template object")
    if method == "create":
        obj = _trimmed({"apiVersion": kept.api_version, **template})
        state[key] = obj
        return Change(at, "create", place, obj), True
    before = state.get(key)
    merge, after = patches.strategic_to_merge(before, template)
    if after is not None:
        state[key] = after
    return Change(at, "patch", place, merge or {}), before is not None


def _trimmed(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in (obj.get("metadata") or {}).items()
                if k not in SERVER_METADATA}
    return {**obj, "metadata": metadata}


def _key_of(api_version: str, plural: str, obj: dict[str, Any]) -> _Key:
    metadata = obj.get("metadata") or {}
    return (api_version, plural, str(metadata.get("namespace") or ""),
            str(metadata.get("name", "")))


def _plurals(documents: list[Any]) -> dict[tuple[str, str], str]:
    """(apiVersion, kind) → resource, as the recording's own creates pair them."""
    found = {}
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == KIND and doc.get("method") == "create":
            template, resource = doc.get("template"), doc.get("resource") or {}
            if isinstance(template, dict) and template.get("kind") and resource.get("resource"):
                group, version = resource.get("group") or "", resource.get("version") or ""
                found[(f"{group}/{version}" if group else version, str(template["kind"]))] = \
                    str(resource["resource"])
    return found


def _plural(kind: str) -> str:
    """The resource of a kind no create in the recording names: the API's usual plural."""
    lower = kind.lower()
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "o", "u"):
        return lower[:-1] + "ies"
    if lower.endswith(("s", "x", "ch", "sh")):
        return lower + "es"
    return lower + "s"


def losses(trace: Trace, cluster: str) -> list[str]:
    """What writing ``cluster`` of ``trace`` in KWOK's format leaves out."""
    lost = []
    if trace.pods:
        lost.append(f"{len(trace.pods)} pod lives as recorded (KWOK's format has none: read "
                    f"back, they are derived again from the pods' recorded states)")
    others = [c for c in trace.clusters if c != cluster]
    if others:
        lost.append(f"clusters {', '.join(others)} (KWOK's format holds one)")
    if trace.notes:
        lost.append("the trace's notes (what sanitising dropped)")
    return lost


def write(trace: Trace, *, cluster: str) -> str:
    """``cluster`` of ``trace`` as KWOK's YAML stream."""
    if cluster not in trace.clusters:
        raise TraceError(f"the trace has no cluster {cluster!r}; it has "
                         f"{', '.join(trace.clusters)}: name one with --cluster")
    return yaml.safe_dump_all(_documents(trace, cluster), sort_keys=False,
                              default_flow_style=False)


def _documents(trace: Trace, cluster: str) -> Iterator[dict[str, Any]]:
    state: dict[Target, dict[str, Any]] = {}
    # The objects at the start have no resource: they are found by apiVersion and name.
    started: dict[tuple[str, str, str], dict[str, Any]] = {}
    for owner, obj in trace.initial:
        if owner == cluster:
            metadata = obj.get("metadata") or {}
            started[(str(obj.get("apiVersion")), str(metadata.get("namespace") or ""),
                     str(metadata.get("name")))] = obj
            yield obj
    for change in trace.changes:
        if change.target.cluster != cluster:
            continue
        entry: dict[str, Any] = {
            "apiVersion": API_VERSION, "kind": KIND,
            "resource": {"group": change.target.resource.group,
                         "version": change.target.resource.version,
                         "resource": change.target.resource.resource},
            "target": {"name": change.target.name, "namespace": change.target.namespace},
            "durationNanosecond": change.at, "method": change.method}
        if not change.target.resource.group:
            del entry["resource"]["group"]
        if not change.target.namespace:
            del entry["target"]["namespace"]
        if change.method == "create" and change.template is not None:
            state[change.target] = change.template
            entry["template"] = change.template
        elif change.method == "patch" and change.template is not None:
            before = state.get(change.target) or started.get((
                change.target.resource.api_version, change.target.namespace,
                change.target.name), {})
            entry["template"] = patches.as_strategic(change.template, before)
            state[change.target] = patches.apply(before, change.template)
        else:
            state.pop(change.target, None)
        yield entry
