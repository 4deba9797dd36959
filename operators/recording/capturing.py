"""What a recorder makes of what it lists and watches: the objects at the start, each change
after it (a create with the whole object, a merge patch from the state before, a delete), the
pods' lives, all on one clock for every cluster recorded.

A :class:`Capture` keeps the last recorded state of every object (trimmed and sanitised, as
the trace holds it) and nothing else of the past: the changes it returns are for the caller to
stream out. So a watch that resumes and sees an object again, or a relist after a 410 Gone,
makes no duplicate: an object equal to its recorded state is no change, one that differs is a
patch, one gone from the relist a delete, one whose UID changed a delete and a create.

Pure: times come in with each call (seconds since the epoch, from the recorder's clock), and
nothing is read or written here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from operators.recording import patches, podlives
from operators.recording.sanitizing import Rules, recorded
from operators.recording.trace import Change, PodLife, Resource, Target

NANOS = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class Watched:
    """One resource of one cluster, as its discovery describes it."""

    cluster: str
    resource: Resource
    kind: str
    namespaced: bool


@dataclasses.dataclass
class Listing:
    """What a list gave: the objects at the start (the first list of a resource), or the
    changes since the state recorded (a relist)."""

    initial: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    changes: list[Change] = dataclasses.field(default_factory=list)


_Key = tuple[str, Resource, str, str]


class Capture:
    """The recorded state of the clusters, and what each list or event changes in it."""

    def __init__(self, *, start: float, rules: Rules) -> None:
        self.start = start
        self.rules = rules
        self._objects: dict[_Key, tuple[str, dict[str, Any]]] = {}  # (uid, object)
        self._listed: set[tuple[str, Resource]] = set()
        self._lives: dict[tuple[str, str], PodLife] = {}  # (cluster, uid)
        self._last = 0

    def at(self, now: float) -> int:
        """``now`` on the trace's clock: nanoseconds since the start, never going back (one
        clock for every cluster and every watch, whatever order their callbacks run in)."""
        self._last = max(self._last, round((now - self.start) * NANOS))
        return self._last

    def listed(self, watched: Watched, items: Iterable[dict[str, Any]], now: float) -> Listing:
        """A (re)list of ``watched``: its objects at the start if it is the first, else the
        changes that the watch missed."""
        first = (watched.cluster, watched.resource) not in self._listed
        self._listed.add((watched.cluster, watched.resource))
        result = Listing()
        present = set()
        for item in items:
            key = self._key(watched, item)
            present.add(key)
            if first:
                self._objects[key] = (_uid(item), self._recorded(watched, item))
                self._observe_pod(watched, item)
                result.initial.append(self._objects[key][1])
            else:
                result.changes.extend(self._changed(watched, key, item, now))
        if not first:
            gone = [key for key in self._objects
                    if key[:2] == (watched.cluster, watched.resource) and key not in present]
            for key in sorted(gone):
                result.changes.append(self._deleted(key, now))
        return result

    def event(self, watched: Watched, kind: str, obj: dict[str, Any],
              now: float) -> list[Change]:
        """A watch event (ADDED, MODIFIED, DELETED) of ``watched``: the changes it makes."""
        key = self._key(watched, obj)
        if kind == "DELETED":
            if key not in self._objects:
                return []
            self._observe_pod(watched, obj)
            return [self._deleted(key, now)]
        return self._changed(watched, key, obj, now)

    def lives(self) -> tuple[PodLife, ...]:
        """Every pod seen, with its ordinal among its owner's pods."""
        return podlives.numbered(self._lives.values())

    def _key(self, watched: Watched, obj: dict[str, Any]) -> _Key:
        metadata = obj.get("metadata") or {}
        return (watched.cluster, watched.resource, str(metadata.get("namespace") or ""),
                str(metadata.get("name", "")))

    def _recorded(self, watched: Watched, obj: dict[str, Any]) -> dict[str, Any]:
        return recorded(obj, kind=watched.kind, api_version=watched.resource.api_version,
                        rules=self.rules)

    def _observe_pod(self, watched: Watched, obj: dict[str, Any]) -> None:
        if watched.resource == POD:
            key = (watched.cluster, _uid(obj))
            self._lives[key] = podlives.life(watched.cluster, obj, start=self.start,
                                             seen=self._lives.get(key))

    def _changed(self, watched: Watched, key: _Key, obj: dict[str, Any],
                 now: float) -> list[Change]:
        self._observe_pod(watched, obj)
        after = self._recorded(watched, obj)
        uid = _uid(obj)
        known = self._objects.get(key)
        self._objects[key] = (uid, after)
        target = Target(key[0], key[1], key[2], key[3])
        if known is None:
            return [Change(self.at(now), "create", target, after)]
        if known[0] != uid:  # deleted and made again between two sights
            at = self.at(now)
            return [Change(at, "delete", target), Change(at, "create", target, after)]
        patch = patches.diff(known[1], after)
        return [] if patch is None else [Change(self.at(now), "patch", target, patch)]

    def _deleted(self, key: _Key, now: float) -> Change:
        del self._objects[key]
        return Change(self.at(now), "delete", Target(key[0], key[1], key[2], key[3]))


POD = Resource("", "v1", "pods")


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))
