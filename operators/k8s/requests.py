"""Requests as plain data, built before any I/O: method, path, query, body, content type.

A :class:`Request` says everything the wire needs (the trace context included); the builders
below are the only way the rest of fakefleet makes one, so a unit test can assert on requests
without a network, and the transport (:mod:`operators.k8s.transport`) is the only code that
sends them. Bodies are encoded here, once: what a test sees is what the API server would
receive.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

Params = Mapping[str, str | int]


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request to an API server."""

    method: str
    path: str
    params: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    content_type: str | None = None
    #: Decode the response body (hot-path writes skip it: they need no copy of what they wrote).
    decode: bool = True
    #: For a watch: the longest silence tolerated between two lines, in seconds.
    read_timeout: float | None = None
    #: Headers beyond what the transport sets: the trace context (``traceparent``) of a
    #: request made in a sampled span (:meth:`operators.k8s.client.Client.send` adds it).
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def query(self) -> dict[str, str]:
        return dict(self.params)

    def json(self) -> Any:
        """The decoded body (for tests and the in-memory transport)."""
        return None if self.body is None else json.loads(self.body)


def encode(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _params(params: Params | None) -> tuple[tuple[str, str], ...]:
    return tuple((key, str(value)) for key, value in (params or {}).items())


def get(path: str, params: Params | None = None) -> Request:
    return Request("GET", path, _params(params))


def create(path: str, body: Any, *, decode: bool = True) -> Request:
    return Request("POST", path, body=encode(body), content_type=JSON, decode=decode)


def replace(path: str, body: Any) -> Request:
    return Request("PUT", path, body=encode(body), content_type=JSON)


def patch(path: str, body: Any, *, content_type: str = MERGE_PATCH,
          decode: bool = True) -> Request:
    return Request("PATCH", path, body=encode(body), content_type=content_type, decode=decode)


def server_side_apply(path: str, body: Any, *, field_manager: str) -> Request:
    """Server-side apply of a whole object (JSON is YAML), taking over conflicting fields:
    the object is ours to keep as rendered."""
    return Request("PATCH", path, (("fieldManager", field_manager), ("force", "true")),
                   body=encode(body), content_type=APPLY_PATCH)


def delete(path: str, *, body: Any = None, params: Params | None = None,
           decode: bool = True) -> Request:
    return Request("DELETE", path, _params(params),
                   body=None if body is None else encode(body),
                   content_type=None if body is None else JSON, decode=decode)


def watch(path: str, params: Params | None, *, timeout_seconds: int,
          read_timeout: float) -> Request:
    """A watch that the server ends after ``timeout_seconds``, with bookmarks."""
    query = {**(params or {}), "watch": "1", "allowWatchBookmarks": "true",
             "timeoutSeconds": str(timeout_seconds)}
    return Request("GET", path, _params(query), read_timeout=read_timeout)


def delete_options(*, grace_period: int | None = None, uid: str | None = None,
                   propagation: str | None = None) -> dict[str, Any]:
    """A DeleteOptions body: grace period, a uid precondition (never delete a namesake), and
    how dependents go (``propagation``: Background, Foreground or Orphan)."""
    options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    if grace_period is not None:
        options["gracePeriodSeconds"] = grace_period
    if uid is not None:
        options["preconditions"] = {"uid": uid}
    if propagation is not None:
        options["propagationPolicy"] = propagation
    return options
