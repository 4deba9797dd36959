"""Label selectors with Kubernetes' semantics, and kubectl's text form of them.

One meaning for every selector fakefleet evaluates: a FaultPlan's targets, a hub run's or
workload's clusters, the engine's stages (over any field, through :func:`test`), and the
in-memory API of the unit tests. As in Kubernetes, every part must hold, an empty selector
matches everything, and an object without the key is not ``In`` the values (so it is
``NotIn`` them).

:func:`parse` reads what ``kubectl -l`` takes: ``region=eu,gpu in (h100,b200),!spot,tier!=dev``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, cast

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Exists", "DoesNotExist")


class SelectorError(ValueError):
    """A selector that cannot be read; the message names the part and what is accepted."""


def test(operator: Operator, values: Collection[str]) -> Callable[[str | None], bool]:
    """Whether a value (None: the key is absent) satisfies ``operator`` over ``values``."""
    chosen = frozenset(values)
    if operator == "In":
        return lambda value: value is not None and value in chosen
    if operator == "NotIn":
        return lambda value: value is None or value not in chosen
    if operator == "Exists":
        return lambda value: value is not None
    return lambda value: value is None


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One of a label selector's matchExpressions."""

    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def holds(self, labels: Mapping[str, str]) -> bool:
        return test(self.operator, self.values)(labels.get(self.key))


@dataclasses.dataclass(frozen=True)
class LabelSelector:
    """matchLabels and matchExpressions, all of which must hold; empty matches everything."""

    match_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return (all(labels.get(key) == value for key, value in self.match_labels.items())
                and all(requirement.holds(labels) for requirement in self.match_expressions))

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> LabelSelector:
        """From Kubernetes' JSON form (``matchLabels``, ``matchExpressions`` of ``key``,
        ``operator``, ``values``); operators are taken as checked by whoever accepted it."""
        data = data or {}
        return cls(dict(data.get("matchLabels") or {}), tuple(
            Requirement(item["key"], cast(Operator, item["operator"]),
                        tuple(item.get("values") or ()))
            for item in data.get("matchExpressions") or ()))


EVERYTHING = LabelSelector()

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_EQUALS = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


def _terms(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [term for term in terms if term.strip()]


def parse(text: str) -> LabelSelector:
    """kubectl's form: equality goes to matchLabels, the rest to matchExpressions (``k!=v`` is
    NotIn, ``k`` Exists, ``!k`` DoesNotExist). A malformed term raises :class:`SelectorError`
    naming it."""
    labels: dict[str, str] = {}
    expressions: list[Requirement] = []
    for term in _terms(text):
        if match := _SET.match(term):
            key, operator, values = match.groups()
            expressions.append(Requirement(
                key, "In" if operator == "in" else "NotIn",
                tuple(v.strip() for v in values.split(",") if v.strip())))
        elif match := _EQUALS.match(term):
            key, operator, value = match.groups()
            if operator == "!=":
                expressions.append(Requirement(key, "NotIn", (value,)))
            else:
                labels[key] = value
        elif match := _EXISTS.match(term):
            negated, key = match.groups()
            expressions.append(Requirement(key, "DoesNotExist" if negated else "Exists"))
        else:
            raise SelectorError(f"selector term {term.strip()!r} is not understood: use k=v, "
                                f"k!=v, 'k in (a,b)', 'k notin (a,b)', k or !k, joined by commas")
    return LabelSelector(labels, tuple(expressions))
