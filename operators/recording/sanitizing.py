"""What a recorded object keeps: metadata trimmed to what a create takes, and what must not
leave the cluster dropped or hashed, because recordings are shared.

- Secrets' ``data`` and ``stringData`` values: dropped (each key kept, its value empty, so that
  a pod that mounts the key still starts on replay) unless the recording keeps them;
- ``env`` values (in pods, and in every pod template) whose variable name matches a pattern;
- annotations whose key matches a pattern (by default ``kubectl.kubernetes.io/
  last-applied-configuration``, which repeats the whole object, env values included).

``hash`` replaces a value by ``sha256:`` and its first 16 hex digits instead of dropping it, so
that a replay still tells a changed value from an unchanged one. Pure functions; no I/O.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
from typing import Any, Literal

Mode = Literal["drop", "hash"]

#: Env variables whose values are dropped unless told otherwise: names that say they hold a
#: credential.
DEFAULT_ENV = (r"(?i)(pass|secret|token|key|credential|auth)",)
#: Annotations dropped unless told otherwise.
DEFAULT_ANNOTATIONS = (r"^kubectl\.kubernetes\.io/last-applied-configuration$",)

#: What the API server sets and a create does not take (``generateName`` is kept: a create
#: does take it, and a replayed controller's pods are named by it).
SERVER_METADATA = frozenset({
    "uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
    "deletionTimestamp", "deletionGracePeriodSeconds"})


@dataclasses.dataclass(frozen=True)
class Rules:
    mode: Mode = "drop"
    keep_secret_data: bool = False
    env: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in DEFAULT_ENV)
    annotations: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in DEFAULT_ANNOTATIONS)

    def notes(self) -> tuple[str, ...]:
        """What these rules leave out, for the trace's notes."""
        done = "dropped" if self.mode == "drop" else "hashed (sha256:)"
        said = []
        if not self.keep_secret_data:
            said.append(f"Secrets' data values {done}")
        if self.env:
            said.append(f"env values of variables matching "
                        f"{', '.join(p.pattern for p in self.env)} {done}")
        if self.annotations:
            said.append(f"annotations matching {', '.join(p.pattern for p in self.annotations)} "
                        f"{done}")
        return tuple(said)


def compile_patterns(patterns: tuple[str, ...], *, flag: str) -> tuple[re.Pattern[str], ...]:
    """``patterns`` compiled; ValueError naming the flag and the pattern for a bad one."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as error:
            raise ValueError(f"{flag} {pattern!r} is not a regular expression ({error}): give "
                             f"one such as '(?i)token'") from error
    return tuple(compiled)


def hashed(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def recorded(obj: dict[str, Any], *, kind: str, api_version: str,
             rules: Rules) -> dict[str, Any]:
    """``obj`` as a trace keeps it: with its apiVersion and kind (a list's items may lack
    them), server metadata trimmed, sanitised by ``rules``. ``obj`` is not changed."""
    metadata = {key: value for key, value in (obj.get("metadata") or {}).items()
                if key not in SERVER_METADATA}
    annotations = metadata.get("annotations")
    if annotations and rules.annotations:
        kept = _sanitised_map(annotations, rules.annotations, rules.mode)
        if kept:
            metadata["annotations"] = kept
        else:
            metadata.pop("annotations")
    result: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": metadata}
    for key, value in obj.items():
        if key not in ("apiVersion", "kind", "metadata"):
            result[key] = _sanitised_env(value, rules) if rules.env else value
    if kind == "Secret" and api_version == "v1" and not rules.keep_secret_data:
        for field in ("data", "stringData"):
            if isinstance(result.get(field), dict):
                result[field] = {key: _secret_value(value, field, rules.mode)
                                 for key, value in result[field].items()}
    return result


def _sanitised_map(values: dict[str, Any], patterns: tuple[re.Pattern[str], ...],
                   mode: Mode) -> dict[str, Any]:
    kept = {}
    for key, value in values.items():
        if not any(p.search(key) for p in patterns):
            kept[key] = value
        elif mode == "hash":
            kept[key] = hashed(str(value))
    return kept


def _sanitised_env(value: Any, rules: Rules) -> Any:
    """``value`` with every ``env`` list's matching values dropped or hashed, however deep
    (pods, Deployments' and Jobs' templates, CronJobs' job templates, custom resources)."""
    if isinstance(value, list):
        return [_sanitised_env(item, rules) for item in value]
    if not isinstance(value, dict):
        return value
    result = {}
    for key, item in value.items():
        if key == "env" and isinstance(item, list):
            result[key] = [_env_var(var, rules) for var in item]
        else:
            result[key] = _sanitised_env(item, rules)
    return result


def _env_var(var: Any, rules: Rules) -> Any:
    if not isinstance(var, dict) or "value" not in var or not any(
            p.search(str(var.get("name", ""))) for p in rules.env):
        return var
    if rules.mode == "hash":
        return {**var, "value": hashed(str(var["value"]))}
    return {key: value for key, value in var.items() if key != "value"}


def _secret_value(value: Any, field: str, mode: Mode) -> str:
    if mode == "drop":
        return ""
    digest = hashed(str(value))
    # data holds base64; stringData plain text: each stays valid for its field.
    return base64.b64encode(digest.encode()).decode() if field == "data" else digest
