"""The trace file: a :class:`~operators.recording.trace.Trace` framed as every portable
fakefleet file is (:mod:`primitives.framing`: magic line, JSON header, gzip payload with its
SHA-256), so that a trace is versioned, checksummed and compressed like a snapshot::

    fakefleet-trace\\n
    {"format": 1, "clusters": [...], "startedAt": ..., "duration": ..., "initial": N,
     "changes": N, "pods": N, "notes": [...], "writtenBy": ..., "payloadBytes": ...,
     "sha256": ...}\\n
    <gzip of JSON lines>          {"initial": {"cluster": C, "object": {...}}}, then
                                  {"change": {"at": ..., "method": ..., "target": {...},
                                  "template": ...}} in the order of ``at``, then {"pod": {...}}

One JSON line per entry, so that a recorder streams the entries out as they come
(:func:`write_lines`) and never holds them all. Errors (:class:`TraceError`) name the file and
the fix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from operators.controlplane.errors import ControlPlaneError
from operators.recording.trace import Change, Owner, PodLife, Resource, Target, Trace
from primitives import framing

MAGIC = b"fakefleet-trace\n"
#: The format this fakefleet writes, and the latest it reads (see :mod:`primitives.framing`).
FORMAT = 1
#: The file name's usual ending (any name is read).
SUFFIX = ".trace"


class TraceError(ControlPlaneError):
    """A trace cannot be read or written, or a recording cannot be made; the message names the
    file or the cluster, and the fix."""


KIND = framing.Kind(magic=MAGIC, noun="trace", format=FORMAT,
                    writer="'fakefleet record'",
                    when_missing="give the file that 'fakefleet record -o' wrote",
                    use="replay it", error=TraceError)


@dataclasses.dataclass(frozen=True)
class Summary:
    """A trace's header: what it holds, read without its payload."""

    clusters: tuple[str, ...]
    started_at: str
    duration: int
    initial: int
    changes: int
    pods: int
    notes: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        return {"clusters": list(self.clusters), "startedAt": self.started_at,
                "duration": self.duration, "initial": self.initial, "changes": self.changes,
                "pods": self.pods, "notes": list(self.notes)}


def summary_of(trace: Trace) -> Summary:
    return Summary(trace.clusters, trace.started_at, trace.duration, len(trace.initial),
                   len(trace.changes), len(trace.pods), trace.notes)


# -- entries as lines ------------------------------------------------------------------------

def _line(entry: dict[str, Any]) -> bytes:
    return json.dumps(entry, separators=(",", ":"), sort_keys=True).encode() + b"\n"


def initial_line(cluster: str, obj: dict[str, Any]) -> bytes:
    return _line({"initial": {"cluster": cluster, "object": obj}})


def change_line(change: Change) -> bytes:
    target = change.target
    return _line({"change": {
        "at": change.at, "method": change.method, "template": change.template,
        "target": {"cluster": target.cluster, "group": target.resource.group,
                   "version": target.resource.version, "resource": target.resource.resource,
                   "namespace": target.namespace, "name": target.name}}})


def pod_line(life: PodLife) -> bytes:
    fields = dataclasses.asdict(life)
    return _line({"pod": fields})


def trace_lines(trace: Trace) -> Iterator[bytes]:
    for cluster, obj in trace.initial:
        yield initial_line(cluster, obj)
    for change in trace.changes:
        yield change_line(change)
    for life in trace.pods:
        yield pod_line(life)


# -- the file ----------------------------------------------------------------------------------

def encode(trace: Trace) -> bytes:
    """The file's bytes (a trace small enough to hold: tests, conversions)."""
    return framing.encode(KIND, summary_of(trace).fields(), b"".join(trace_lines(trace)))


def write_lines(path: Path, summary: Summary, lines: Iterable[bytes]) -> int:
    """Write a trace whose entries are ``lines`` (in the file's order), streamed: whole or not
    at all, 0600 (a recording may hold what its sanitising kept). Returns its size."""
    try:
        return framing.write_streamed(KIND, path, summary.fields(), lines)
    except OSError as error:
        raise TraceError(f"cannot write trace {path}: {error}: give -o a path in a writable "
                         f"directory") from error


def write(path: Path, trace: Trace) -> int:
    return write_lines(path, summary_of(trace), trace_lines(trace))


def read_summary(path: Path) -> Summary:
    """The header of the trace at ``path``."""
    return _summary(path, framing.read_header(KIND, path))


def read(path: Path) -> Trace:
    """The trace at ``path``, checked whole (format, length, checksum) before it is decoded."""
    raw, payload = framing.read(KIND, path)
    summary = _summary(path, raw)
    initial: list[tuple[str, dict[str, Any]]] = []
    changes: list[Change] = []
    pods: list[PodLife] = []
    for number, line in enumerate(payload.splitlines(), start=1):
        try:
            entry = json.loads(line)
            if "initial" in entry:
                initial.append((str(entry["initial"]["cluster"]),
                                dict(entry["initial"]["object"])))
            elif "change" in entry:
                changes.append(_change(entry["change"]))
            elif "pod" in entry:
                pods.append(_pod(entry["pod"]))
            else:
                raise ValueError(f"an entry of none of the known kinds: {sorted(entry)}")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise framing.unreadable(KIND, path, ValueError(f"line {number}: {error}")) \
                from error
    return Trace(clusters=summary.clusters, started_at=summary.started_at,
                 duration=summary.duration, initial=tuple(initial), changes=tuple(changes),
                 pods=tuple(pods), notes=summary.notes)


def _summary(path: Path, raw: dict[str, Any]) -> Summary:
    try:
        return Summary(clusters=tuple(raw["clusters"]), started_at=str(raw["startedAt"]),
                       duration=int(raw["duration"]), initial=int(raw["initial"]),
                       changes=int(raw["changes"]), pods=int(raw["pods"]),
                       notes=tuple(raw.get("notes") or ()))
    except (KeyError, TypeError, ValueError) as error:
        raise TraceError(f"trace {path}'s header lacks or garbles {error}: copy it again from "
                         f"where it was recorded") from error


def _change(raw: dict[str, Any]) -> Change:
    target = raw["target"]
    method = raw["method"]
    if method not in ("create", "patch", "delete"):
        raise ValueError(f"method {method!r} is none of create, patch, delete")
    return Change(at=int(raw["at"]), method=method, template=raw.get("template"),
                  target=Target(cluster=str(target["cluster"]), resource=Resource(
                      str(target["group"]), str(target["version"]), str(target["resource"])),
                      namespace=str(target["namespace"]), name=str(target["name"])))


def _pod(raw: dict[str, Any]) -> PodLife:
    owner = raw.get("owner")
    return PodLife(**{**raw, "owner": Owner(**owner) if owner else None})
