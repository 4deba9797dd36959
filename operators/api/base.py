"""Shared pieces of fakefleet's custom resources: the model base, conditions, quantities and the
metadata that turns a model into a CustomResourceDefinition.

The pydantic models are the single source of the API: the CRD YAML under ``crds/`` is generated
from them (:mod:`operators.api.crdgen`), and the operator parses objects with the same models.
Field docstrings become the schema's descriptions, so what ``kubectl explain`` prints is written
here, next to the field.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from operators.api.names import rule, validations
from primitives.keys import GROUP

VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: A Kubernetes resource quantity ("32", "256Gi", "500m") or a plain integer. Quantities here are
#: amounts a node has, so never negative: the pattern (Kubernetes' quantity syntax) admits a
#: sign, and the rule, which the API server only evaluates on values that match it, refuses a
#: negative amount with a message a person can act on. The length bounds the rule's cost.
Quantity = Annotated[
    int | str,
    WithJsonSchema({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                   r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        "maxLength": 64,
        "x-kubernetes-int-or-string": True,
        **validations(rule(
            "type(self) == int ? self >= 0 : sign(quantity(self)) >= 0",
            "quantity must not be negative: use 0 or more, e.g. 0, 32, 256Gi or 500m",
        )),
    }),
]


class Model(BaseModel):
    """Base of every API model: camelCase field names as in the YAML, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class Condition(Model):
    """A kstatus-style condition (Ready, Reconciling, Stalled)."""

    type: str
    """Condition type, e.g. Ready."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = ""
    """One CamelCase word saying why."""
    message: str = ""
    """What a person should know, including what to do."""
    lastTransitionTime: str = ""
    """When status last changed (RFC 3339)."""
    observedGeneration: int = 0
    """The metadata.generation this condition was computed for."""


@dataclasses.dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0


@dataclasses.dataclass(frozen=True)
class ResourceInfo:
    """What a CRD needs besides the schema: names, columns, subresources, the rules on the whole
    object (the only place a CEL rule can read ``self.metadata.name``) and the fields that
    list and watch requests can select on (``fieldSelector=spec.clusterRef=west``)."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    printer_columns: tuple[PrinterColumn, ...]
    scale: bool = False
    categories: tuple[str, ...] = ("fakefleet",)
    rules: tuple[dict[str, str], ...] = ()
    selectable_fields: tuple[str, ...] = ()

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


class CustomResource(Model):
    """A whole object: apiVersion, kind, metadata, spec, status."""

    resource: ClassVar[ResourceInfo]
    apiVersion: str = API_VERSION
    kind: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)


def immutable(message: str) -> dict[str, str]:
    """CEL rule: the field may be set on create but never changed afterwards."""
    return rule("self == oldSelf", message)
