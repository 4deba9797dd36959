"""Replay: a recording (a trace) replayed into a FakeCluster, as an object a GitOps repository
can hold beside the fleet and its FaultPlans::

    apiVersion: fakefleet.dev/v1alpha1
    kind: Replay
    metadata: {name: monday-peak}
    spec:
      clusterRef: west
      trace:
        configMapRef: {name: monday-peak-trace, key: trace}
      speed: 10
      seed: "7"

What ``fakefleet replay FILE --into CLUSTER`` does, the operator does for the object
(:mod:`operators.recording.running`): the trace is read from the ConfigMap key (a fakefleet
trace, or KWOK's YAML recording, gzipped or not), planned and replayed with the same code, and
the status says how far it got, how far it lags behind the timeline, and which writes the
member's API refused, and why. docs/replay.md holds the design.

Everything the API server can check, it checks (schema, CEL): a bad Replay is refused when it
is applied, with the field named and what would be accepted.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, WithJsonSchema

from operators.api.base import (
    Condition,
    CustomResource,
    Model,
    PrinterColumn,
    ResourceInfo,
    immutable,
)
from operators.api.clusters import MAX_CLUSTER_NAME_LENGTH
from operators.api.faultplans import TIME_PATTERN
from operators.api.names import rule, validations
from operators.api.nodepools import CLUSTER_REF_RULE

#: A replay's speed bounds (recorded seconds per second), as the CLI's ``--speed`` has them.
MIN_SPEED = 0.001
MAX_SPEED = 1_000_000
#: The word for "as fast as the member's API server takes the writes".
AS_FAST_AS_POSSIBLE = "max"
#: A ConfigMap holds at most this many bytes (the API server's own limit on its data): a
#: larger trace is replayed with ``fakefleet replay`` from its file.
CONFIGMAP_LIMIT = 1 << 20
#: The refused writes the status lists one by one (the rest are counted), and the characters
#: of each reason: the status stays small however much the API refuses.
MAX_REFUSED_LISTED = 20
MAX_REASON_LENGTH = 300

SPEED_MESSAGE = (f"speed must be a factor from {MIN_SPEED} to {MAX_SPEED} (10: ten times as "
                 f"fast as recorded; quote a fraction: \"0.5\"), or {AS_FAST_AS_POSSIBLE} for "
                 f"as fast as the member's API server takes the writes")

#: The replay's pace: an integer or a decimal string, or ``max``. Integers and strings only
#: (x-kubernetes-int-or-string): a structural schema allows no number-or-string, so a fraction
#: is written as a string. The pattern bounds the digits; the rule (evaluated only on values
#: that match it) bounds the factor.
Speed = Annotated[
    int | str,
    WithJsonSchema({
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "x-kubernetes-int-or-string": True,
        "pattern": rf"^({AS_FAST_AS_POSSIBLE}|[0-9]{{1,7}}(\.[0-9]{{1,6}})?)$",
        "maxLength": 16,
        "default": 1,
        "description": "Recorded seconds per second (10: ten times as fast as recorded), from "
                       f"{MIN_SPEED} to {MAX_SPEED}; a fraction as a string (\"0.5\"); "
                       f"{AS_FAST_AS_POSSIBLE}: as fast as the member's API server takes the "
                       "writes, pods' lives as recorded. Default 1.",
        **validations(rule(
            f"type(self) == int ? (self >= 1 && self <= {MAX_SPEED}) : "
            f"(self == '{AS_FAST_AS_POSSIBLE}' || (double(self) >= {MIN_SPEED} && "
            f"double(self) <= {MAX_SPEED}.0))",
            SPEED_MESSAGE)),
    }),
]


def speed_factor(speed: int | str) -> float:
    """``speed`` as :class:`operators.recording.planning.Options` takes it (0: ``max``);
    ValueError with :data:`SPEED_MESSAGE` outside the bounds (the API server refuses those, so
    only an object written around the schema gets here)."""
    if speed == AS_FAST_AS_POSSIBLE:
        return 0.0
    try:
        factor = float(speed)
    except ValueError:
        factor = float("nan")
    if not MIN_SPEED <= factor <= MAX_SPEED:
        raise ValueError(f"{speed!r}: {SPEED_MESSAGE}")
    return factor


class ConfigMapKeyRef(Model):
    """One key of a ConfigMap in the Replay's namespace."""

    name: str = Field(min_length=1, max_length=253, json_schema_extra=validations(rule(
        "!format.dns1123Subdomain().validate(self).hasValue()",
        "trace.configMapRef.name must be the name of a ConfigMap: lower-case letters, digits, "
        "'-' and '.', alphanumeric at both ends")))
    """The ConfigMap's name (same namespace as the Replay)."""
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """The key that holds the trace: under binaryData (a fakefleet trace is binary: kubectl
    create configmap --from-file puts it there), or under data (KWOK's YAML)."""


class TraceSource(Model):
    """Where the recording is."""

    configMapRef: ConfigMapKeyRef
    """A ConfigMap key holding the trace file as 'fakefleet record -o' or 'kwokctl snapshot
    record' wrote it, gzipped or not. A ConfigMap holds at most 1 MiB: replay a larger trace
    with 'fakefleet replay FILE --into CLUSTER'."""


class ReplaySpec(Model):
    """Desired state of a Replay. Immutable once created: delete and re-create to replay
    again or differently."""

    model_config = Model.model_config | {"json_schema_extra": validations(
        immutable("spec is immutable: delete the Replay and apply it again (a replay runs "
                  "once; what it wrote stays in the cluster)"),
    )}

    clusterRef: str = Field(
        min_length=1, max_length=MAX_CLUSTER_NAME_LENGTH, json_schema_extra=validations(
            CLUSTER_REF_RULE))
    """Name of the FakeCluster (same namespace) the trace is replayed into; the replay waits
    until it exists and its API server answers."""
    trace: TraceSource
    """Where the recording is."""
    from_: str = Field(default="", alias="from", max_length=253)
    """The trace's cluster to replay, when the trace holds several (a fleet trace); a KWOK
    recording's is 'kwok'. Empty: the trace's only cluster."""
    speed: Speed = 1
    seed: str | None = Field(default=None, min_length=1, max_length=64)
    """Seed of the replayed pods' random draws (start-delay jitter, log lines), so that two
    replays draw alike."""
    rawPods: bool = False
    """Replay the recorded pods as bare pods with their recorded lives, and leave out their
    controllers (default: the member's controllers make the pods, which take the recorded
    lives)."""
    startAt: str | None = Field(default=None, max_length=64, pattern=TIME_PATTERN)
    """The replay's time zero, an RFC 3339 time such as 2030-01-02T15:04:05Z: the trace's
    start happens then (Pending until it comes; writes already due when it is in the past go
    at once). Default: when the operator first runs the Replay."""


# -- status ------------------------------------------------------------------------------------

Phase = Literal["Pending", "Running", "Succeeded", "Failed"]


class RefusedWrite(Model):
    """A write the member's API refused for good."""

    write: str
    """What was written: method, kind, namespace/name (create Widget rp/w)."""
    reason: str
    """Why, in the API server's words, and what to do."""


class ReplayStatus(Model):
    """Observed state of a Replay: how far it got, how far behind the timeline, and what the
    member's API refused."""

    phase: Phase = "Pending"
    """Pending (waiting for the cluster, the trace or startAt), Running, Succeeded (every
    write taken), Failed (some refused, or the trace cannot be replayed: see the conditions)."""
    run: str = ""
    """This replay's run id: names its lives sets and marks every object it creates
    (fakefleet.dev/owned-by: Replay/<run>), so a restarted operator knows its own."""
    traceSha256: str = ""
    """The SHA-256 of the trace as first read: a trace changed under a running replay stops
    it."""
    startedAt: str = ""
    """The replay's time zero (RFC 3339)."""
    finishedAt: str = ""
    total: int = 0
    """Writes planned."""
    applied: int = 0
    """Writes the member's API took."""
    refusedCount: int = 0
    """Writes it refused for good."""
    dropped: int = 0
    """Later writes of objects whose create was refused, left out with it."""
    leftOut: int = 0
    """Recorded objects and changes the plan leaves out (what the cluster or a replayed
    controller makes itself)."""
    progress: str = ""
    """Writes answered / planned, e.g. 6123/10400."""
    resumeFrom: int = 0
    """Every write before this one (in the plan's order) was answered: a restarted operator
    carries on from here."""
    resumes: int = 0
    """How many times the replay was carried on after a restart (of the operator, or of the
    replay's task after an error)."""
    lagSeconds: float = 0.0
    """How far behind the timeline the last answered write was (answered less due)."""
    maxLagSeconds: float = 0.0
    """The most any write lagged."""
    refused: list[RefusedWrite] = Field(default_factory=list, max_length=MAX_REFUSED_LISTED)
    """The first refused writes, with the reasons (refusedCount counts them all)."""
    observedGeneration: int = 0
    conditions: list[Condition] = Field(default_factory=list)
    """Ready (finished, every write taken), Reconciling (waiting or replaying), Stalled
    (cannot go on: the message says why and what to do)."""


class Replay(CustomResource):
    """A recorded cluster replayed into a FakeCluster on the recorded timeline, scaled by
    speed."""

    resource = ResourceInfo(
        kind="Replay",
        plural="replays",
        short_names=("rpl",),
        printer_columns=(
            PrinterColumn("Cluster", ".spec.clusterRef"),
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Progress", ".status.progress"),
            PrinterColumn("Lag", ".status.lagSeconds", "number",
                          "Seconds the last write came after it was due"),
            PrinterColumn("Refused", ".status.refusedCount", "integer"),
            PrinterColumn("Age", ".metadata.creationTimestamp", "date"),
        ),
        selectable_fields=(".spec.clusterRef",),
    )
    kind: str = "Replay"
    spec: ReplaySpec
    status: ReplayStatus | None = None
