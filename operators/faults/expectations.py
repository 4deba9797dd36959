"""Expectations: what must become true after an injection, judged on objects as observed.

An expectation picks objects (of one kind, by namespace, name and label selector, or only those a
fault hit, or pods on the nodes it hit) and a matcher:

- ``field``: the value at a path equals a given value (``status.active`` equals ``8``);
- ``condition``: a condition of the given type has the given status (and reason, if given);
- ``taint``: a taint with the given key (and effect, if given) is there;
- ``count``: how many of the picked objects there are, optionally only those a ``where``
  matcher accepts: ``equals``, ``atLeast``, ``atMost``;
- ``cel``: an expression over the object, judged in a worker process
  (:mod:`operators.faults.evaluating`), never here: :class:`Cel` only names it, and
  :meth:`Expectation.decide` takes the worker's answers.

Field, condition and taint hold when at least one object is picked and every picked object
matches; count holds on its number, zero included ("no Running pod on a tainted node").
:class:`Deadline` turns observations over time into ``Passed`` with the latency since the
injection, or ``Failed`` once the deadline passed without the expectation holding.

Paths are dotted field names; ``['key']`` for a map key with dots (``metadata.labels
['nvidia.com/gpu.product']``), ``[N]`` for a list index, ``[field=value]`` for the first list
item whose field has that value (``spec.taints[key=nvidia.com/gpu].effect``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol

from operators.faults.targets import Victim
from primitives.selectors import LabelSelector


class ExpectationError(ValueError):
    """An expectation that cannot be judged; the message names the field and the fix."""


# -- paths -------------------------------------------------------------------------------------

_SEGMENT = re.compile(
    r"""\.?(?:(?P<name>[A-Za-z_$][\w$-]*)"""  # .name
    r"""|\[(?P<quote>['"])(?P<key>.+?)(?P=quote)\]"""  # ['key.with.dots']
    r"""|\[(?P<index>[0-9]+)\]"""  # [3]
    r"""|\[(?P<field>[\w$-]+)=(?P<value>[^\]]*)\])"""  # [key=value]
)
_MISSING = object()


def parse_path(path: str) -> tuple[tuple[str, ...], ...]:
    """Segments of ``path``: ("name", n), ("index", i), ("match", field, value)."""
    segments: list[tuple[str, ...]] = []
    position = 0
    while position < len(path):
        match = _SEGMENT.match(path, position)
        if match is None or match.end() == position or (position == 0 and path.startswith(".")):
            raise ExpectationError(
                f"path {path!r}: cannot read it from character {position + 1}; write dotted "
                f"names, ['key'] for keys with dots, [N] for an index or [field=value] for a "
                f"list item, e.g. spec.taints[key=nvidia.com/gpu].effect")
        if match.group("name") is not None:
            segments.append(("name", match.group("name")))
        elif match.group("key") is not None:
            segments.append(("name", match.group("key")))
        elif match.group("index") is not None:
            segments.append(("index", match.group("index")))
        else:
            segments.append(("match", match.group("field"), match.group("value")))
        position = match.end()
    if not segments:
        raise ExpectationError("path: empty; name a field such as status.phase")
    return tuple(segments)


def resolve(obj: Any, path: str) -> Any:
    """The value at ``path`` in ``obj``, or None where any step of it is missing."""
    value = obj
    for segment in parse_path(path):
        if segment[0] == "name":
            value = value.get(segment[1], _MISSING) if isinstance(value, Mapping) else _MISSING
        elif segment[0] == "index":
            index = int(segment[1])
            value = value[index] if isinstance(value, list) and index < len(value) else _MISSING
        else:
            field, wanted = segment[1], segment[2]
            value = next((item for item in value if isinstance(item, Mapping)
                          and render(item.get(field)) == wanted), _MISSING) if isinstance(
                value, list) else _MISSING
        if value is _MISSING:
            return None
    return value


def render(value: Any) -> str:
    """A value as YAML spells it, so ``equals: "8"`` and ``equals: 8`` both match 8."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    return str(value)


# -- matchers ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Field:
    path: str
    equals: str | int | bool

    def __post_init__(self) -> None:
        parse_path(self.path)  # refuse a path that cannot be read now, not at the deadline

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return render(resolve(obj, self.path)) == render(self.equals)


@dataclasses.dataclass(frozen=True)
class Condition:
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""

    def matches(self, obj: Mapping[str, Any]) -> bool:
        for condition in (obj.get("status") or {}).get("conditions") or []:
            if condition.get("type") == self.type:
                return condition.get("status") == self.status and (
                    not self.reason or condition.get("reason") == self.reason)
        return False


@dataclasses.dataclass(frozen=True)
class Taint:
    key: str
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return any(taint.get("key") == self.key and (not self.effect
                                                    or taint.get("effect") == self.effect)
                   for taint in (obj.get("spec") or {}).get("taints") or [])


class Matcher(Protocol):
    """Anything that says here whether one object matches (the three above)."""

    def matches(self, obj: Mapping[str, Any]) -> bool: ...


@dataclasses.dataclass(frozen=True)
class Cel:
    """A CEL expression, true for the objects it accepts. It has no ``matches``: cel-python
    has no cost budget, so only a worker process evaluates it."""

    expression: str


PerObject = Matcher | Cel


def each(matcher: Matcher, objects: Iterable[Mapping[str, Any]]) -> list[bool]:
    """Whether each object matches."""
    return [matcher.matches(obj) for obj in objects]


@dataclasses.dataclass(frozen=True)
class Count:
    where: PerObject | None = None
    equals: int | None = None
    at_least: int | None = None
    at_most: int | None = None

    def __post_init__(self) -> None:
        bounds = (self.equals, self.at_least, self.at_most)
        if all(bound is None for bound in bounds):
            raise ExpectationError("count: give equals, atLeast or atMost")
        if any(bound is not None and bound < 0 for bound in bounds):
            raise ExpectationError("count: equals, atLeast and atMost must not be negative")

    def holds(self, objects: Sequence[Mapping[str, Any]]) -> bool:
        if isinstance(self.where, Cel):
            raise ExpectationError("a cel matcher is judged by the CEL workers: use decide()")
        return self.counts(each(self.where, objects) if self.where is not None
                           else [True] * len(objects))

    def counts(self, matched: Sequence[bool]) -> bool:
        """Whether the number of objects ``where`` accepted (``matched``: one bool each) is
        within the bounds."""
        number = sum(1 for match in matched if match)
        return ((self.equals is None or number == self.equals)
                and (self.at_least is None or number >= self.at_least)
                and (self.at_most is None or number <= self.at_most))


# -- which objects -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Objects:
    """The objects an expectation looks at, of one kind in each cluster the step targets (or
    in the host cluster)."""

    api_version: str
    kind: str
    namespace: str = ""
    name: str = ""
    selector: LabelSelector | None = None
    #: Only objects the step's fault hit.
    victims: bool = False
    #: Pods only: only pods on the nodes the step's fault hit.
    on_victim_nodes: bool = False
    cluster: Literal["member", "host"] = "member"
    #: Pods only: only pods not on the nodes the step's fault hit (where they were rescheduled).
    off_victim_nodes: bool = False

    def __post_init__(self) -> None:
        if (self.on_victim_nodes or self.off_victim_nodes) and self.kind != "Pod":
            raise ExpectationError("onVictimNodes and offVictimNodes: only for kind Pod (pods "
                                   "on, or off, the nodes hit)")
        if self.on_victim_nodes and self.off_victim_nodes:
            raise ExpectationError("give onVictimNodes or offVictimNodes, not both")
        if (self.victims or self.on_victim_nodes or self.off_victim_nodes) and \
                self.cluster == "host":
            raise ExpectationError("victims, onVictimNodes and offVictimNodes are member "
                                   "objects: use cluster: member")

    def pick(self, cluster: str, objects: Iterable[Mapping[str, Any]],
             victims: Iterable[Victim]) -> list[Mapping[str, Any]]:
        """Those of ``objects`` (all of this kind, as listed in ``cluster``) that are meant."""
        hit = [v for v in victims if v.cluster == cluster]
        names = {(v.namespace, v.name) for v in hit if v.kind == self.kind}
        nodes = {v.name for v in hit if v.kind == "Node"}
        picked = []
        for obj in objects:
            meta = obj.get("metadata") or {}
            if self.namespace and meta.get("namespace") != self.namespace:
                continue
            if self.name and meta.get("name") != self.name:
                continue
            if self.selector is not None and not self.selector.matches(meta.get("labels") or {}):
                continue
            if self.victims and (meta.get("namespace", ""), meta.get("name")) not in names:
                continue
            node = (obj.get("spec") or {}).get("nodeName")
            if self.on_victim_nodes and node not in nodes:
                continue
            if self.off_victim_nodes and node in nodes:
                continue
            picked.append(obj)
        return picked


@dataclasses.dataclass(frozen=True)
class Expectation:
    name: str
    within: float
    objects: Objects
    matcher: PerObject | Count

    def __post_init__(self) -> None:
        if not self.within > 0:
            raise ExpectationError(f"expectation {self.name!r}: within must be a positive "
                                   f"duration such as 60s (the deadline after the injection)")

    @property
    def per_object(self) -> PerObject | None:
        """What each picked object is matched with (a count's where; None: nothing, a count
        of every picked object)."""
        return self.matcher.where if isinstance(self.matcher, Count) else self.matcher

    def decide(self, matched: Sequence[bool]) -> bool:
        """Whether it holds, given whether each picked object matched :attr:`per_object`
        (every one of them, for a count without where)."""
        if isinstance(self.matcher, Count):
            return self.matcher.counts(matched)
        return bool(matched) and all(matched)

    def holds(self, picked: Sequence[Mapping[str, Any]]) -> bool:
        """Whether it holds for ``picked``, for matchers judged here (not cel)."""
        matcher = self.per_object
        if isinstance(matcher, Cel):
            raise ExpectationError("a cel matcher is judged by the CEL workers: use decide()")
        return self.decide(each(matcher, picked) if matcher is not None
                           else [True] * len(picked))


# -- over time ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Result:
    name: str
    outcome: Literal["Passed", "Failed"]
    #: Seconds from the injection to the first observation where it held (Passed), or to the
    #: deadline (Failed).
    latency: float


@dataclasses.dataclass
class Deadline:
    """One expectation of one injection, judged on successive observations."""

    expectation: Expectation
    injected_at: float
    result: Result | None = None

    @property
    def due(self) -> float:
        return self.injected_at + self.expectation.within

    def observe(self, now: float, holds: bool) -> Result | None:
        """The result once there is one: the first observation that holds, within the
        deadline, passes; an observation at or past the deadline that does not hold fails."""
        if self.result is None:
            if holds and now <= self.due:
                self.result = Result(self.expectation.name, "Passed",
                                     max(0.0, now - self.injected_at))
            elif now >= self.due:
                self.result = Result(self.expectation.name, "Failed", self.expectation.within)
        return self.result


def verdict(results: Iterable[Result | None]) -> Literal["Passed", "Failed"] | None:
    """Failed as soon as one failed; Passed once all passed; None while any is pending."""
    pending = False
    for result in results:
        if result is None:
            pending = True
        elif result.outcome == "Failed":
            return "Failed"
    return None if pending else "Passed"
