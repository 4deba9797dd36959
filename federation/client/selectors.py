"""Cluster selectors written as kubectl writes label selectors, for the command line.

``region=eu,gpu in (h100,b200),!spot,tier!=dev`` becomes a ClusterSelector
(:func:`primitives.selectors.parse` reads it: equality goes to match_labels, the rest to
match_expressions). A malformed term raises :class:`~primitives.selectors.SelectorError`
naming it.
"""

from __future__ import annotations

from federation.api import common_pb2
from primitives import selectors


def parse(text: str, names: list[str] | None = None) -> common_pb2.ClusterSelector:
    selector = selectors.parse(text)
    return common_pb2.ClusterSelector(
        names=names or [], match_labels=dict(selector.match_labels),
        match_expressions=[common_pb2.LabelRequirement(key=r.key, operator=r.operator,
                                                       values=list(r.values))
                           for r in selector.match_expressions])
