"""Cluster selectors written as kubectl writes label selectors, for the command line.

``region=eu,gpu in (h100,b200),!spot,tier!=dev`` becomes a ClusterSelector: equality goes to
match_labels, the rest to match_expressions (``k!=v`` is NotIn, ``k`` Exists, ``!k``
DoesNotExist). A malformed term raises :class:`SelectorError` naming it.
"""

from __future__ import annotations

import re

from federation.api import common_pb2


class SelectorError(ValueError):
    pass


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


def parse(text: str, names: list[str] | None = None) -> common_pb2.ClusterSelector:
    selector = common_pb2.ClusterSelector(names=names or [])
    for term in _terms(text):
        if match := _SET.match(term):
            key, operator, values = match.groups()
            selector.match_expressions.append(common_pb2.LabelRequirement(
                key=key, operator="In" if operator == "in" else "NotIn",
                values=[v.strip() for v in values.split(",") if v.strip()]))
        elif match := _EQUALS.match(term):
            key, operator, value = match.groups()
            if operator == "!=":
                selector.match_expressions.append(common_pb2.LabelRequirement(
                    key=key, operator="NotIn", values=[value]))
            else:
                selector.match_labels[key] = value
        elif match := _EXISTS.match(term):
            negated, key = match.groups()
            selector.match_expressions.append(common_pb2.LabelRequirement(
                key=key, operator="DoesNotExist" if negated else "Exists"))
        else:
            raise SelectorError(f"selector term {term.strip()!r} is not understood: use k=v, "
                                f"k!=v, 'k in (a,b)', 'k notin (a,b)', k or !k, joined by commas")
    return selector
