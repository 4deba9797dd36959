"""Lives sets: recorded pod lives handed to the pods a controller makes in a replay. Pure: the
format, the names and the one change the engine makes.

``fakefleet replay`` replays a workload (a Deployment, a Job) as an object, and the member's
real controllers make its pods. Those pods cannot carry their recorded start delay, run time
and exit code in their own annotations: the controller writes them from one template for all.
So the replay writes the owner's recorded lives, in the order the recorded controller made its
pods, into one *lives set* (a ConfigMap in the member's ``fakefleet-system``) and names the set
in the template's annotation ``fakefleet.dev/lives``. The engine, before it starts a pod that
carries the annotation, takes the lowest ordinal no pod took yet, writes which pod took it
into the set (conditional on the set's resourceVersion, so no two pods take one ordinal,
whatever writes at once), and gives the pod that life through its stages' own inputs (the
pod's start delay, run time and exit code)::

    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: lives-5f0c2a9e1d7b3c4a8e6f
      namespace: fakefleet-system
      labels: {fakefleet.dev/lives: ""}
      annotations: {fakefleet.dev/owned-by: Replay/3f9a}
    data:
      owner: default/Job/batch
      lives: '[{"startDelay": 1.0, "runTime": 20.0, "exitCode": 0}, {"startDelay": 1.0}]'
      taken: '{"<pod uid>": 0}'

A life's missing field is the pod's default (the pool's): a recorded pod that had not started
or not ended when the recording stopped. A pod past the last life gets no life and nothing
is written for it: the set stays as large as the recording made it, however many pods a
controller makes and deletes. The pod's ordinal is kept by uid in the set, so an engine
restarted finds the same life for each pod it adopts, and a pod made anew after a deletion
takes a new ordinal.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from primitives import keys

#: The member namespace fakefleet owns (fault sets live there too).
NAMESPACE = "fakefleet-system"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"


class LivesError(ValueError):
    """A lives set that cannot be read: names the set, the key and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Life:
    """What one pod is to do, in seconds on the replay's timeline (already scaled)."""

    start_delay: float | None = None
    run_time: float | None = None
    exit_code: int | None = None

    def render(self) -> dict[str, Any]:
        fields = {"startDelay": self.start_delay, "runTime": self.run_time,
                  "exitCode": self.exit_code}
        return {key: value for key, value in fields.items() if value is not None}


def set_name(run: str, namespace: str, kind: str, name: str) -> str:
    """The set of one owner in one replay run: a digest, so any owner's name fits."""
    digest = hashlib.sha256(f"{run}/{namespace}/{kind}/{name}".encode()).hexdigest()[:20]
    return f"lives-{digest}"


def render(name: str, *, owner: str, writer: str, lives: Sequence[Life]) -> dict[str, Any]:
    """The ConfigMap of a lives set; ``owner`` is ``namespace/Kind/name``, for people."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {keys.LIVES: ""},
                     "annotations": {keys.OWNED_BY: writer}},
        "data": {"owner": owner, "lives": json.dumps([life.render() for life in lives]),
                 "taken": "{}"},
    }


def _loaded(data: Mapping[str, str], key: str, name: str, kind: type) -> Any:
    try:
        value = json.loads(data.get(key) or ("[]" if kind is list else "{}"))
    except ValueError as error:
        raise LivesError(f"lives set {NAMESPACE}/{name}: data.{key} is not JSON ({error}); "
                         f"replay the trace again") from None
    if not isinstance(value, kind):
        raise LivesError(f"lives set {NAMESPACE}/{name}: data.{key} is a "
                         f"{type(value).__name__}, a {kind.__name__} was written")
    return value


def _life(raw: Any, name: str, ordinal: int) -> Life:
    if not isinstance(raw, dict):
        raise LivesError(f"lives set {NAMESPACE}/{name}: life {ordinal} is not a mapping")

    def number(key: str) -> float | None:
        value = raw.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or \
                value != value or value > 10**9:
            raise LivesError(f"lives set {NAMESPACE}/{name}: life {ordinal}: {key} {value!r} "
                             f"is not a number of seconds from 0 to 1e9")
        return float(value)
    code = raw.get("exitCode")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)
                             or not 0 <= code <= 255):
        raise LivesError(f"lives set {NAMESPACE}/{name}: life {ordinal}: exitCode {code!r} "
                         f"is not an integer from 0 to 255")
    return Life(number("startDelay"), number("runTime"), code)


def claim(configmap: Mapping[str, Any], uid: str) -> tuple[int, Life | None,
                                                             dict[str, Any] | None]:
    """The ordinal pod ``uid`` takes in the set, its life (None past the last one), and the
    conditional merge patch that records the choice (None: the pod took it before, or every
    life is taken, which needs no write: a pod past the last life is not recorded, so the set
    never outgrows its lives however long a controller keeps replacing pods)."""
    name = configmap["metadata"]["name"]
    data = configmap.get("data") or {}
    lives = _loaded(data, "lives", name, list)
    taken: dict[str, Any] = _loaded(data, "taken", name, dict)
    patch = None
    ordinal = taken.get(uid)
    if not isinstance(ordinal, int):
        used = {value for value in taken.values() if isinstance(value, int)}
        ordinal = next(n for n in range(len(used) + 1) if n not in used)
        if ordinal >= len(lives):
            return ordinal, None, None
        taken = {**taken, uid: ordinal}
        patch = {"metadata": {"resourceVersion": configmap["metadata"]["resourceVersion"]},
                 "data": {"taken": json.dumps(taken, sort_keys=True)}}
    life = _life(lives[ordinal], name, ordinal) if ordinal < len(lives) else None
    return ordinal, life, patch
