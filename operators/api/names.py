"""Label keys, label values and other qualified names as Kubernetes validates them, as schema
fragments with CEL rules (``x-kubernetes-validations``).

Strings from a FakeCluster or FakeNodePool end up in the labels, annotations and taints of real
Nodes; if the API server accepted a value that core/v1 refuses, the pool would never get its
nodes and nobody would say why. So the rules here use Kubernetes' own CEL format library
(``format.qualifiedName()``, ``format.labelValue()``): the same checks as core/v1 makes, made
when the object is submitted, with messages that spell out what would be accepted.

Every string, map and list here is bounded (maxLength, maxProperties, maxItems): the API server
estimates the worst-case cost of each rule from those bounds and refuses a CRD whose rules could
cost too much. This module is only schema (the lengths and the words come from
:mod:`primitives.names`, which the hub checks with too); which names a resource derives from
its own name is said next to that resource.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from primitives.names import (
    LABEL_VALUE_MAX_LENGTH,
    LABEL_VALUE_SYNTAX,
    QUALIFIED_NAME_MAX_LENGTH,
    QUALIFIED_NAME_SYNTAX,
)

#: Labels or annotations one map may hold: more than any fleet needs, and it bounds rule cost.
MAX_ENTRIES = 64

CEL = "x-kubernetes-validations"


def rule(expression: str, message: str, *, message_expression: str = "",
         field_path: str = "") -> dict[str, str]:
    """One CEL rule; ``message`` stands in when ``message_expression`` cannot be evaluated."""
    entry = {"rule": expression, "message": message}
    if message_expression:
        entry["messageExpression"] = message_expression
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """Schema fragment carrying ``rules``."""
    return {CEL: list(rules)}


def label_value(what: str) -> Any:
    """Annotation of a string that becomes a label value; ``what`` names it in messages.

    The API server shows the refused value next to the message, so the message only says what
    would be accepted.
    """
    return Field(max_length=LABEL_VALUE_MAX_LENGTH, json_schema_extra=validations(rule(
        "!format.labelValue().validate(self).hasValue()",
        f"{what} must be a label value: {LABEL_VALUE_SYNTAX}")))


def qualified_name(what: str) -> Any:
    """Annotation of a string that becomes a label, annotation or taint key."""
    return Field(min_length=1, max_length=QUALIFIED_NAME_MAX_LENGTH, json_schema_extra=validations(
        rule("!format.qualifiedName().validate(self).hasValue()",
             f"{what} must be a qualified name {QUALIFIED_NAME_SYNTAX}")))


def keys_are_qualified_names(what: str) -> dict[str, str]:
    """CEL rule for a map whose keys become label, annotation or resource names.

    The keys have no schema of their own, so the rule sits on the map, and its message names
    the first key it refuses (the API server would show the whole map). Kubernetes' own wording
    (``validate(k).value()``) is not used: its size is unbounded in the cost estimate.
    """
    check = "format.qualifiedName().validate(k)"
    return rule(
        f"self.all(k, !{check}.hasValue())",
        f"every {what} must be a qualified name {QUALIFIED_NAME_SYNTAX}",
        message_expression=(f"\"'\" + self.filter(k, {check}.hasValue())[0] + "
                            f"\"' is not a valid {what}: use a qualified name "
                            f"{QUALIFIED_NAME_SYNTAX}\""),
    )


#: Labels: qualified-name keys, label values, at most :data:`MAX_ENTRIES`.
Labels = Annotated[
    dict[str, Annotated[str, label_value("value")]],
    Field(max_length=MAX_ENTRIES, json_schema_extra=validations(
        keys_are_qualified_names("label key"))),
]

#: Annotations: qualified-name keys, free values, at most :data:`MAX_ENTRIES`.
Annotations = Annotated[
    dict[str, str],
    Field(max_length=MAX_ENTRIES, json_schema_extra=validations(
        keys_are_qualified_names("annotation key"))),
]
