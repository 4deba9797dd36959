"""An in-memory transport for unit tests of the I/O paths: retries, conflicts, watches that
break, answers that come late or never, and restarts, all on a fake clock.

It keeps objects in dicts and answers the handful of verbs fakefleet sends (get, list with
label and field selectors and pagination, watch, create, replace, merge and strategic-merge
patch of an object or its status, server-side apply (a merge that creates what is missing;
field ownership is not modelled), delete with preconditions, finalizers and pod grace periods)
the way the API server does, closely enough to exercise the engine. It is not an API server:
no admission (but, with ``namespaces=True``, the refusal of an object whose namespace is not
there), no defaulting beyond metadata, no validation. End-to-end tests run on real ones.

Faults are injected per request, matched by method and a path pattern::

    api.fail("PATCH", r"/api/v1/namespaces/.*/pods/.*/status", status=500)     # once
    api.fail("GET", "/api/v1/nodes", status=403, times=3)
    api.fail("POST", "/api/v1/nodes", reset=True, applied=True)   # done, but the answer lost
    api.fail("PATCH", ".*", delay=45)                              # past the client timeout
    api.fail("PATCH", ".*", late=2)                # done (and watched) at once, answered later
    api.break_watches(); api.compact()                             # resumes get 410

:class:`Saturated` in front of it serves a few requests at a time and answers 429 past them.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import itertools
import json
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from operators.k8s.errors import TransportError
from operators.k8s.requests import APPLY_PATCH, MERGE_PATCH, STRATEGIC_PATCH, Request
from operators.k8s.times import rfc3339
from operators.k8s.transport import Response, StreamResponse, Transport
from primitives.clocks import Clock
from primitives.selectors import LabelSelector, parse

#: Kinds whose status is a subresource: the main path ignores status, /status takes only it.
WITH_STATUS = frozenset({"nodes", "pods", "namespaces", "fakeclusters", "fakenodepools"})
#: Kinds whose spec changes bump metadata.generation.
GENERATED = frozenset({"fakeclusters", "fakenodepools"})

Key = tuple[str, str]  # (group/version, plural)


@dataclasses.dataclass
class Fault:
    method: str
    pattern: re.Pattern[str]
    status: int | None
    reason: str
    headers: dict[str, str]
    reset: bool
    applied: bool
    delay: float
    times: int
    late: float = 0.0


@dataclasses.dataclass(frozen=True)
class _Target:
    key: Key
    namespace: str
    name: str
    subresource: str


@dataclasses.dataclass
class _Event:
    version: int
    key: Key
    kind: str
    obj: dict[str, Any]


class MemoryTransport:
    """Objects in memory behind the :class:`~operators.k8s.transport.Transport` seam."""

    def __init__(self, clock: Clock, *, git_version: str = "v1.36.3",
                 timeout: float = 30.0, namespaces: bool = False) -> None:
        self.clock = clock
        #: Whether a create into a namespace not there is refused (404), as the API server's
        #: NamespaceLifecycle admission refuses it.
        self.namespaces = namespaces
        self.git_version = git_version
        self.timeout = timeout
        self.requests: list[Request] = []
        self.faults: list[Fault] = []
        self._objects: dict[Key, dict[tuple[str, str], dict[str, Any]]] = {}
        self._events: list[_Event] = []
        self._version = 0
        self._compacted = 0
        self._uids = itertools.count(1)
        self._changed = asyncio.Event()
        self._epoch = 0  # bumped by break_watches(): open streams end with a reset
        #: Watches show no event past this version (a watch cache behind the writes); None:
        #: they show every one.
        self._shown: int | None = None
        self._discovery: dict[str, dict[str, Any]] = {}
        self.closed = False

    # -- what tests call ----------------------------------------------------------------------

    def fail(self, method: str, path: str, *, status: int | None = None, reason: str = "",
             headers: Mapping[str, str] | None = None, reset: bool = False,
             applied: bool = False, delay: float = 0.0, times: int = 1,
             late: float = 0.0) -> None:
        """Make the next ``times`` matching requests fail: answer ``status``, or reset the
        connection (``applied``: after doing what was asked), or answer after ``delay``, or
        do what was asked at once and answer ``late`` (watches show the write before its
        answer comes, as on a busy API server)."""
        self.faults.append(Fault(method, re.compile(path), status, reason, dict(headers or {}),
                                 reset, applied, delay, times, late))

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` in the collection at ``path`` as if someone else created it."""
        target = _parse(path)
        return self._create(target, copy.deepcopy(obj))

    def objects(self, path: str) -> list[dict[str, Any]]:
        """Copies of the objects in the collection at ``path`` (all namespaces if not one)."""
        target = _parse(path)
        return [copy.deepcopy(obj) for (namespace, _), obj in
                sorted(self._objects.get(target.key, {}).items())
                if not target.namespace or namespace == target.namespace]

    def object(self, path: str) -> dict[str, Any] | None:
        target = _parse(path)
        found = self._objects.get(target.key, {}).get((target.namespace, target.name))
        return copy.deepcopy(found) if found is not None else None

    def sent(self, method: str, pattern: str = ".*") -> list[Request]:
        """Requests sent so far with ``method`` to paths matching ``pattern``."""
        compiled = re.compile(pattern)
        return [r for r in self.requests if r.method == method and compiled.fullmatch(r.path)]

    def discover(self, group_version: str, resources: list[dict[str, Any]]) -> None:
        """Serve the discovery document of ``group_version`` (``v1``, ``apps/v1``) with
        ``resources`` (``{"name": "nodes", "kind": "Node", "namespaced": False}``)."""
        path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        self._discovery[path] = {"kind": "APIResourceList", "groupVersion": group_version,
                                 "resources": resources}

    def compact(self) -> None:
        """Forget history: watches and continue tokens from before now answer 410 Gone."""
        self._compacted = self._version

    def hold_watches(self) -> None:
        """Watches show nothing written from now on (writes are answered at once), as a busy
        API server's watch cache lags behind its answers, until :meth:`release_watches`."""
        self._shown = self._version

    def release_watches(self, through: str | None = None) -> None:
        """Watches show what was held, up to the write of resourceVersion ``through`` (None:
        all, and nothing is held any more)."""
        self._shown = int(through) if through is not None else None
        self._wake()

    def break_watches(self) -> None:
        """End every open watch with a connection reset."""
        self._epoch += 1
        self._wake()

    # -- the Transport protocol ---------------------------------------------------------------

    async def send(self, request: Request) -> Response:
        self.requests.append(request)
        fault = self._fault(request)
        if fault is not None and fault.late:
            answer = self._answer(request)
            await self.clock.sleep(fault.late)
            return answer
        if fault is not None:
            if fault.delay:
                await self.clock.sleep(min(fault.delay, self.timeout))
                if fault.delay >= self.timeout:
                    raise TransportError(f"{request.method} {request.path}: timed out")
            if fault.applied:
                self._answer(request)
            if fault.reset:
                raise TransportError(f"{request.method} {request.path}: connection reset")
            if fault.status is not None:
                return _status(fault.status, fault.reason, "injected fault", fault.headers)
            if fault.applied:
                raise TransportError(f"{request.method} {request.path}: answer lost")
        return self._answer(request)

    @contextlib.asynccontextmanager
    async def stream(self, request: Request) -> AsyncIterator[StreamResponse]:
        self.requests.append(request)
        fault = self._fault(request)
        if fault is not None:
            if fault.delay:
                await self.clock.sleep(fault.delay)
            if fault.reset:
                raise TransportError(f"watch {request.path}: connection reset")
            if fault.status is not None:
                yield _Stream(_status(fault.status, fault.reason, "injected fault",
                                      fault.headers), None)
                return
        yield _Stream(Response(200, {}, b""), self._watch(request))

    def refresh_credentials(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True

    # -- answering ----------------------------------------------------------------------------

    def _fault(self, request: Request) -> Fault | None:
        for fault in self.faults:
            if fault.times > 0 and fault.method in (request.method, "*") and \
                    fault.pattern.fullmatch(request.path):
                fault.times -= 1
                return fault
        return None

    def _answer(self, request: Request) -> Response:
        if request.path == "/version":
            return _ok({"gitVersion": self.git_version, "major": "1", "minor": "36"})
        if request.path == "/readyz":
            return Response(200, {}, b"ok")
        # A group (version) not served is a 404, as the API server answers it.
        if request.method == "GET" and request.path.rstrip("/") in self._discovery:
            return _ok(self._discovery[request.path.rstrip("/")])
        if request.method == "GET" and re.fullmatch(r"/api/v1|/apis/[^/]+(/[^/]+)?",
                                                     request.path.rstrip("/")):
            return _status(404, "NotFound", "the server could not find the requested resource")
        target = _parse(request.path)
        query = request.query
        if request.method == "GET":
            if target.name:
                found = self._objects.get(target.key, {}).get((target.namespace, target.name))
                if found is None:
                    return _status(404, "NotFound", f"{target.name} not found")
                return _ok(found)
            return self._list(target, query)
        if request.method == "POST":
            body = request.json()
            name = body.get("metadata", {}).get("name", "")
            if self.namespaces and target.namespace and ("", target.namespace) not in \
                    self._objects.get(("v1", "namespaces"), {}):
                return _status(404, "NotFound", f'namespaces "{target.namespace}" not found',
                               details={"name": target.namespace, "kind": "namespaces"})
            if (target.namespace, name) in self._objects.get(target.key, {}):
                return _status(409, "AlreadyExists", f'"{name}" already exists')
            return _ok(self._create(target, body), 201)
        current = self._objects.get(target.key, {}).get((target.namespace, target.name))
        if current is None and request.method == "PATCH" and \
                request.content_type == APPLY_PATCH:
            return _ok(self._create(target, request.json()), 201)
        if current is None:
            return _status(404, "NotFound", f"{target.name} not found")
        if request.method == "PUT":
            body = request.json()
            if body.get("metadata", {}).get("resourceVersion") != \
                    current["metadata"]["resourceVersion"]:
                return _status(409, "Conflict", "the object has been modified")
            body["metadata"] = {**current["metadata"], **body["metadata"]}
            return _ok(self._update(target, current, body))
        if request.method == "PATCH":
            return self._patch(target, current, request)
        if request.method == "DELETE":
            return self._delete(target, current, request.json() or {})
        return _status(405, "MethodNotAllowed", request.method)

    def _list(self, target: _Target, query: Mapping[str, str]) -> Response:
        start = 0
        if query.get("continue"):  # "<resourceVersion of the first page>:<offset>"
            version, _, offset = query["continue"].partition(":")
            if int(version) < self._compacted:
                return _status(410, "Expired", "the continue token is too old")
            start = int(offset)
        items = sorted(self._matching(target, query), key=lambda o: (
            o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        limit = int(query.get("limit", "0")) or len(items) or 1
        page = items[start:start + limit]
        metadata: dict[str, Any] = {"resourceVersion": str(self._version)}
        if start + limit < len(items):
            metadata["continue"] = f"{self._version}:{start + limit}"
        return _ok({"kind": "List", "apiVersion": "v1", "metadata": metadata, "items": page})

    def _matching(self, target: _Target, query: Mapping[str, str]) -> Iterator[dict[str, Any]]:
        labels = parse(query.get("labelSelector", ""))
        fields = _field_selector(query.get("fieldSelector", ""))
        for (namespace, _), obj in self._objects.get(target.key, {}).items():
            if target.namespace and namespace != target.namespace:
                continue
            if _selected(obj, labels, fields):
                yield obj

    def _create(self, target: _Target, body: dict[str, Any]) -> dict[str, Any]:
        metadata = body.setdefault("metadata", {})
        if target.namespace:
            metadata["namespace"] = target.namespace
        metadata.setdefault("uid", f"uid-{next(self._uids):06d}")
        metadata.setdefault("creationTimestamp", rfc3339(self.clock.now()))
        metadata.setdefault("generation", 1)
        self._objects.setdefault(target.key, {})[(target.namespace, metadata["name"])] = body
        self._record(target.key, "ADDED", body)
        return body

    def _update(self, target: _Target, current: dict[str, Any],
                updated: dict[str, Any]) -> dict[str, Any]:
        if target.key[1] in GENERATED and _spec(updated) != _spec(current):
            updated["metadata"]["generation"] = current["metadata"].get("generation", 1) + 1
        metadata = updated["metadata"]
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            return self._remove(target, updated)
        self._objects[target.key][(target.namespace, target.name)] = updated
        self._record(target.key, "MODIFIED", updated)
        return updated

    def _patch(self, target: _Target, current: dict[str, Any], request: Request) -> Response:
        patch = request.json()
        if request.content_type not in (MERGE_PATCH, STRATEGIC_PATCH, APPLY_PATCH):
            return _status(415, "UnsupportedMediaType", str(request.content_type))
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected is not None and expected != current["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified")
        uid = (patch.get("metadata") or {}).get("uid")
        if uid is not None and uid != current["metadata"].get("uid"):  # as the API server says
            return _status(422, "Invalid", f'{target.name!r} is invalid: metadata.uid: Invalid '
                                           f'value: "{uid}": field is immutable')
        status_only = target.subresource == "status"
        if status_only:
            patch = {"status": patch.get("status")} if "status" in patch else {}
        elif target.key[1] in WITH_STATUS:
            patch = {k: v for k, v in patch.items() if k != "status"}
        updated = _merge(copy.deepcopy(current), patch, request.content_type == STRATEGIC_PATCH)
        updated["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if updated == current:
            return _ok(current)
        return _ok(self._update(target, current, updated))

    def _delete(self, target: _Target, current: dict[str, Any],
                options: dict[str, Any]) -> Response:
        uid = (options.get("preconditions") or {}).get("uid")
        if uid is not None and uid != current["metadata"]["uid"]:
            return _status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}, "
                                            f"UID in object meta: {current['metadata']['uid']}")
        metadata = current["metadata"]
        grace = options.get("gracePeriodSeconds")
        if target.key[1] == "pods" and current.get("spec", {}).get("nodeName"):
            if grace is None:
                grace = current["spec"].get("terminationGracePeriodSeconds", 30)
            if grace > 0 or metadata.get("finalizers"):
                if metadata.get("deletionTimestamp") is None:
                    updated = copy.deepcopy(current)
                    updated["metadata"]["deletionTimestamp"] = rfc3339(self.clock.now() + grace)
                    updated["metadata"]["deletionGracePeriodSeconds"] = grace
                    return _ok(self._update(target, current, updated))
                if not metadata.get("finalizers") and grace == 0:
                    return _ok(self._remove(target, current))
                return _ok(current)
        if metadata.get("finalizers"):
            if metadata.get("deletionTimestamp") is None:
                updated = copy.deepcopy(current)
                updated["metadata"]["deletionTimestamp"] = rfc3339(self.clock.now())
                return _ok(self._update(target, current, updated))
            return _ok(current)
        return _ok(self._remove(target, current))

    def _remove(self, target: _Target, obj: dict[str, Any]) -> dict[str, Any]:
        self._objects[target.key].pop((target.namespace, target.name), None)
        self._record(target.key, "DELETED", obj)
        return obj

    def _record(self, key: Key, kind: str, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        self._events.append(_Event(self._version, key, kind, copy.deepcopy(obj)))
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _watch(self, request: Request) -> AsyncIterator[bytes]:
        target = _parse(request.path)
        query = request.query
        since = int(query.get("resourceVersion") or self._version)
        if since < self._compacted:
            yield _line({"type": "ERROR", "object": {
                "kind": "Status", "code": 410, "reason": "Expired",
                "message": f"too old resource version: {since} ({self._compacted})"}})
            return
        labels = parse(query.get("labelSelector", ""))
        fields = _field_selector(query.get("fieldSelector", ""))
        deadline = self.clock.now() + int(query.get("timeoutSeconds", "300"))
        epoch = self._epoch
        while True:
            for event in [e for e in self._events if e.version > since and
                          (self._shown is None or e.version <= self._shown)]:
                if self._epoch != epoch:
                    break
                since = event.version
                if event.key != target.key or (
                        target.namespace and event.obj["metadata"].get("namespace")
                        != target.namespace) or not _selected(event.obj, labels, fields):
                    continue
                yield _line({"type": event.kind, "object": event.obj})
            if self._epoch != epoch:
                raise TransportError(f"watch {request.path}: connection reset")
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                return
            await self.clock.wait(self._changed, remaining)


class _Stream:
    def __init__(self, response: Response, lines: AsyncIterator[bytes] | None) -> None:
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers
        self._body = response.body
        self._lines = lines

    async def read(self) -> bytes:
        return self._body

    async def lines(self) -> AsyncIterator[bytes]:
        if self._lines is not None:
            async for line in self._lines:
                yield line


def _parse(path: str) -> _Target:
    parts = [part for part in path.split("/") if part]
    if parts[:2] == ["api", "v1"]:
        group_version, rest = "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group_version, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        raise ValueError(f"the in-memory transport does not serve {path}")
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    return _Target((group_version, rest[0]), namespace, rest[1] if len(rest) > 1 else "",
                   rest[2] if len(rest) > 2 else "")


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _ok(obj: Any, status: int = 200) -> Response:
    return Response(status, {"Content-Type": "application/json"}, _line(obj))


def _status(code: int, reason: str, message: str,
            headers: Mapping[str, str] | None = None, *,
            details: Mapping[str, str] | None = None) -> Response:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "code": code, "reason": reason, "message": message}
    if details is not None:
        body["details"] = dict(details)
    return Response(code, dict(headers or {}), _line(body))


def _spec(obj: dict[str, Any]) -> Any:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _merge(target: Any, patch: Any, strategic: bool) -> Any:
    """RFC 7386 merge; with ``strategic``, lists of objects keyed by ``type`` (conditions)
    merge entry by entry, as the strategic merge patch does for node and pod conditions."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif strategic and key == "conditions" and isinstance(value, list) and \
                isinstance(target.get(key), list):
            merged = {c.get("type"): c for c in target[key]}
            for condition in value:
                merged[condition.get("type")] = {**merged.get(condition.get("type"), {}),
                                                 **condition}
            target[key] = list(merged.values())
        else:
            target[key] = _merge(target.get(key), value, strategic)
    return target


def _field_selector(text: str) -> list[tuple[str, str, str]]:
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        operator = "!=" if "!=" in term else "="
        key, value = term.replace("==", "=").split(operator, 1)
        terms.append((key, operator, value))
    return terms


def _selected(obj: dict[str, Any], labels: LabelSelector,
              fields: list[tuple[str, str, str]]) -> bool:
    if not labels.matches(obj["metadata"].get("labels") or {}):
        return False
    for path, operator, value in fields:
        found: Any = obj
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        actual = "" if found is None else str(found)
        if (actual == value) != (operator == "="):
            return False
    return True


class Saturated:
    """An API server that serves ``limit`` requests at a time, each in ``latency`` seconds,
    and answers 429 (``Retry-After``) to every request past them, as one APF flow whose seats
    and queue are full: wraps another transport, for the requests whose path matches
    ``pattern`` (the others pass straight through)."""

    def __init__(self, transport: Transport, clock: Clock, *, limit: int, latency: float,
                 pattern: str = ".*", retry_after: int = 1) -> None:
        self.transport = transport
        self.clock = clock
        self.limit = limit
        self.latency = latency
        self.pattern = re.compile(pattern)
        self.retry_after = retry_after
        self.in_flight = 0
        self.peak = 0  # the most in flight at once, those answered 429 included
        self.served = 0
        self.throttled = 0

    async def send(self, request: Request) -> Response:
        if not self.pattern.fullmatch(request.path):
            return await self.transport.send(request)
        self.peak = max(self.peak, self.in_flight + 1)
        if self.in_flight >= self.limit:
            self.throttled += 1
            return _status(429, "TooManyRequests", "too many requests, please try again later",
                           {"Retry-After": str(self.retry_after)})
        self.in_flight += 1
        try:
            await self.clock.sleep(self.latency)
            response = await self.transport.send(request)
        finally:
            self.in_flight -= 1
        self.served += 1
        return response

    def stream(self, request: Request) -> contextlib.AbstractAsyncContextManager[
            StreamResponse]:
        return self.transport.stream(request)

    def refresh_credentials(self) -> None:
        self.transport.refresh_credentials()

    async def close(self) -> None:
        await self.transport.close()
