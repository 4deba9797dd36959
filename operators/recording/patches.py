"""JSON merge patches (RFC 7386) between two states of an object, and strategic-merge patches
(KWOK's) turned into them.

A trace's changes are merge patches because the API server takes them for every resource,
custom ones included; a strategic-merge patch it refuses for custom resources. A
strategic-merge patch can say what a merge patch cannot:

- lists merged entry by entry under a merge key (``containers`` by ``name``, ``conditions`` by
  ``type``): a merge patch replaces a list whole;
- directives: ``$patch: delete`` / ``replace`` / ``merge`` on a map or a list entry,
  ``$retainKeys``, ``$deleteFromPrimitiveList/<field>``, ``$setElementOrder/<field>``;
- primitive lists merged as sets (``finalizers``).

So a strategic-merge patch is converted by applying it to the object as it was before (the
trace's own state of it) and taking the merge patch from that state to the result: lists the
patch touched are then written whole, and every directive has done its work. Where the state
before is unknown, the directives are dropped and the lists taken as they stand (the caller
notes it). Merge keys are those of the built-in kinds (:data:`MERGE_KEYS`), by field name.

Pure functions on JSON values; no I/O.
"""

from __future__ import annotations

import copy
from typing import Any

#: Fields whose lists the built-in kinds merge by key (the ``patchMergeKey`` of their Go
#: types), by field name: the candidates in order, the first every entry has wins (a Service's
#: ``ports`` merge by ``port``, a container's by ``containerPort``).
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",), "initContainers": ("name",), "ephemeralContainers": ("name",),
    "volumes": ("name",), "env": ("name",), "imagePullSecrets": ("name",),
    "volumeMounts": ("mountPath",), "volumeDevices": ("devicePath",),
    "ports": ("containerPort", "port"), "conditions": ("type",), "ownerReferences": ("uid",),
    "hostAliases": ("ip",), "podIPs": ("ip",), "hostIPs": ("ip",), "addresses": ("type",),
    "resourceClaims": ("name",), "schedulingGates": ("name",),
    "topologySpreadConstraints": ("topologyKey",),
}
#: Lists of strings the built-in kinds merge as sets.
PRIMITIVE_MERGE = frozenset({"finalizers"})

DIRECTIVE = "$patch"
RETAIN = "$retainKeys"
ORDER = "$setElementOrder/"
DELETE_FROM = "$deleteFromPrimitiveList/"


def diff(before: Any, after: Any) -> dict[str, Any] | None:
    """The merge patch that turns ``before`` into ``after`` (both objects), None if they are
    equal. A null in ``after`` cannot be said in a merge patch (null deletes): it is taken as
    the key's absence."""
    if before == after:
        return None
    patch: dict[str, Any] = {}
    for key in before.keys() - after.keys():
        patch[key] = None
    for key, value in after.items():
        old = before.get(key)
        if key in before and old == value:
            continue
        if isinstance(old, dict) and isinstance(value, dict):
            inner = diff(old, value)
            if inner is not None:
                patch[key] = inner
        else:
            patch[key] = copy.deepcopy(value)
    return patch or None


def apply(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to a copy of ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply(result.get(key), value)
    return result


def merged(target: Any, patch: Any) -> Any:
    """RFC 7386 as :func:`apply`, without copying: the result shares what the patch leaves
    alone with ``target`` and its values with ``patch``, so neither may be changed after
    (for readers that only look, such as :mod:`~operators.recording.sequencing`, which walks
    every change of a trace)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


def has_directives(patch: Any) -> bool:
    """Whether a strategic-merge patch says anything a merge patch cannot (directives, or
    lists that a strategic merge would merge by key)."""
    if isinstance(patch, list):
        return any(has_directives(item) for item in patch)
    if not isinstance(patch, dict):
        return False
    for key, value in patch.items():
        if key.startswith("$"):
            return True
        if isinstance(value, list) and (key in PRIMITIVE_MERGE or _merge_key(key, value)):
            return True
        if has_directives(value):
            return True
    return False


def strategic_to_merge(before: dict[str, Any] | None,
                       patch: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]
                                                       | None]:
    """The merge patch with the effect of strategic-merge ``patch`` on ``before``, and the
    object after it (None where ``before`` is unknown: the directives are then dropped and the
    lists taken whole, which is exact only where :func:`has_directives` says False)."""
    if before is None:
        return _without_directives(patch), None
    after = apply_strategic(before, patch)
    return diff(before, after), after


def apply_strategic(target: Any, patch: Any, field: str = "") -> Any:
    """A strategic-merge ``patch`` applied to a copy of ``target``, with the merge keys of
    :data:`MERGE_KEYS`."""
    if isinstance(patch, list):
        return _merge_list(target, patch, field)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get(DIRECTIVE)
    if directive == "delete":
        return None
    if directive == "replace":
        return _without_directives({k: v for k, v in patch.items() if k != DIRECTIVE})
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.get(RETAIN)
    if isinstance(retain, list):
        result = {key: value for key, value in result.items() if key in retain}
    for key, value in patch.items():
        if key.startswith(DELETE_FROM):
            name = key.removeprefix(DELETE_FROM)
            result[name] = [item for item in result.get(name) or [] if item not in value]
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        merged = apply_strategic(result.get(key), value, key)
        if merged is None and isinstance(value, dict) and value.get(DIRECTIVE) == "delete":
            result.pop(key, None)
        else:
            result[key] = merged
    for key, value in patch.items():
        if key.startswith(ORDER) and isinstance(result.get(key.removeprefix(ORDER)), list):
            name = key.removeprefix(ORDER)
            result[name] = _ordered(result[name], value, name)
    return result


def _merge_key(field: str, items: list[Any]) -> str | None:
    if any(not isinstance(item, dict) for item in items):
        return None
    entries = [item for item in items if DIRECTIVE not in item]
    for key in MERGE_KEYS.get(field, ()):
        if entries and all(key in entry for entry in entries):
            return key
    return None


def _merge_list(target: Any, patch: list[Any], field: str) -> list[Any]:
    current = copy.deepcopy(target) if isinstance(target, list) else []
    if any(isinstance(item, dict) and item.get(DIRECTIVE) == "replace" for item in patch):
        return [_without_directives(item) for item in patch
                if not (isinstance(item, dict) and DIRECTIVE in item and len(item) == 1)]
    if field in PRIMITIVE_MERGE and all(not isinstance(item, dict) for item in patch):
        return current + [item for item in patch if item not in current]
    key = _merge_key(field, patch) or _merge_key(field, current)
    if key is None:
        return [_without_directives(item) for item in patch]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            continue
        at = next((i for i, entry in enumerate(current)
                   if isinstance(entry, dict) and entry.get(key) == item[key]), None)
        if item.get(DIRECTIVE) == "delete":
            if at is not None:
                del current[at]
        elif at is None:
            current.append(_without_directives(item))
        else:
            current[at] = apply_strategic(current[at], item)
    return current


def _ordered(items: list[Any], order: list[Any], field: str) -> list[Any]:
    """``items`` in the order ``$setElementOrder`` gives (entries it does not name last)."""
    key = MERGE_KEYS.get(field, ())

    def ident(item: Any) -> Any:
        if isinstance(item, dict):
            return next((item.get(k) for k in key if k in item), None)
        return item

    wanted = [ident(entry) for entry in order]
    rank = {value: i for i, value in enumerate(wanted)}
    return sorted(items, key=lambda item: rank.get(ident(item), len(rank)))


def _without_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_without_directives(item) for item in value
                if not (isinstance(item, dict) and set(item) <= {DIRECTIVE})]
    return value


def as_strategic(patch: dict[str, Any], before: Any) -> dict[str, Any]:
    """A merge patch of ``before`` said as a strategic-merge patch with the same effect (for
    KWOK, which applies its templates as strategic-merge patches): a list under a merge key
    gets ``{"$patch": "replace"}`` so that it is replaced whole, as the merge patch replaces it;
    a set of strings (``finalizers``) names what it loses in ``$deleteFromPrimitiveList``."""
    before = before if isinstance(before, dict) else {}
    result: dict[str, Any] = {}
    for key, value in patch.items():
        if isinstance(value, dict):
            result[key] = as_strategic(value, before.get(key))
        elif isinstance(value, list) and key in PRIMITIVE_MERGE:
            result[key] = value
            gone = [item for item in before.get(key) or [] if item not in value]
            if gone:
                result[DELETE_FROM + key] = gone
        elif isinstance(value, list) and key in MERGE_KEYS and (
                not value or _merge_key(key, value)):
            result[key] = [*value, {DIRECTIVE: "replace"}]
        else:
            result[key] = value
    return result
