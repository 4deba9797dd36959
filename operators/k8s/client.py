"""The client of one API server: sends :mod:`~operators.k8s.requests` through a
:class:`~operators.k8s.transport.Transport` and turns answers into JSON or into the error tree
of :mod:`operators.k8s.errors`, in this one place.

Hot paths (thousands of nodes, leases and pods) need no object model: paths and dicts in, dicts
out. Two answers are handled here for every caller: a 429 is waited out (``Retry-After``) and
sent again, so a throttling server slows fakefleet down instead of piling up failures (a
caller that paces itself takes them at once: :meth:`Client.self_paced`); a 401
asks the transport for fresh credentials once (tokens from exec plugins and files expire).
Everything else is the caller's to decide: only it knows whether a write may be repeated.

A request made while a sampled span is current carries its ``traceparent`` header, so the API
server's spans for it (a kube-apiserver started with ``--tracing-config-file``) are children of
that span. Requests made outside spans (heartbeats, lease renewals, the default pod lifecycle,
watches) carry none and cost one look at the current span: background work is not traced.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from operators.k8s import requests
from operators.k8s.config import ClusterAccess
from operators.k8s.errors import TooManyRequests, TransportError, Unauthorized, api_error
from operators.k8s.requests import MERGE_PATCH, Params, Request
from operators.k8s.transport import AiohttpTransport, Transport
from primitives import propagation
from primitives.clocks import SYSTEM_CLOCK, Clock

#: Watches: the server ends each after this long (we resume from the last resourceVersion);
#: a watch silent for ``WATCH_TIMEOUT + WATCH_GRACE`` is taken as a dead connection.
WATCH_TIMEOUT = 300
WATCH_GRACE = 30.0
#: The trace flags of an outgoing traceparent: sampled (see :func:`traced`).
SAMPLED = "01"


def traced(request: Request) -> Request:
    """``request`` with the trace context of the current span, if it is sampled; the request
    itself (no copy) otherwise.

    The flags say "sampled" and nothing more: the SDK also sets W3C level 2's "random" bit
    (``-03``), and the Go OpenTelemetry that kube-apiserver 1.36 and etcd 3.6 are built with
    (v1.41) rejects a version-00 traceparent with any flag but "sampled", then traces nothing.
    """
    context = propagation.headers()
    if not context:
        return request
    value = context[propagation.HEADER]
    return dataclasses.replace(request, headers=(
        *request.headers, (propagation.HEADER, f"{value[:-2]}{SAMPLED}")))


class Client:
    """An async client of one API server."""

    def __init__(self, transport: Transport, *, clock: Clock = SYSTEM_CLOCK,
                 max_throttle_retries: int = 10, server: str = "") -> None:
        self.transport = transport
        self.server = server
        self._clock = clock
        self._max_throttle_retries = max_throttle_retries

    @classmethod
    def connect(cls, access: ClusterAccess, *, connections: int = 16, timeout: float = 30.0,
                clock: Clock = SYSTEM_CLOCK) -> Client:
        """A client over its own aiohttp connection pool of ``connections``."""
        return cls(AiohttpTransport(access, connections=connections, timeout=timeout),
                   clock=clock, server=access.server)

    def self_paced(self) -> Client:
        """A client over the same transport that hands every 429 to its caller at once: for a
        caller that paces its own requests by the server's answers (the engine's Lease
        renewals), which a ``Retry-After`` slept here, holding a connection, would hide."""
        return Client(self.transport, clock=self._clock, max_throttle_retries=0,
                      server=self.server)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.transport.close()

    async def send(self, request: Request) -> Any:
        """Send ``request``; the decoded JSON answer (None if empty or not asked for)."""
        request = traced(request)
        refreshed = False
        throttled = 0
        while True:
            response = await self.transport.send(request)
            if response.status < 400:
                if not request.decode or not response.body:
                    return None
                return json.loads(response.body)
            error = api_error(response.status, response.body.decode(errors="replace"),
                              response.headers)
            if isinstance(error, Unauthorized) and response.status == 401 and not refreshed:
                refreshed = True
                self.transport.refresh_credentials()
                continue
            if isinstance(error, TooManyRequests) and throttled < self._max_throttle_retries:
                throttled += 1
                await self._clock.sleep(error.retry_after)
                continue
            raise error

    async def stream(self, request: Request) -> AsyncIterator[Any]:
        """Decoded lines of a streaming answer (watch events) until the server ends it."""
        async with self.transport.stream(traced(request)) as response:
            if response.status >= 400:
                if response.status == 401:
                    self.transport.refresh_credentials()
                body = (await response.read()).decode(errors="replace")
                raise api_error(response.status, body, response.headers)
            async for line in response.lines():
                try:
                    yield json.loads(line)
                except ValueError as error:
                    raise TransportError(f"watch {request.path}: a line that is not JSON "
                                         f"({len(line)} bytes): {error}") from error

    # -- the verbs ---------------------------------------------------------------------------

    async def get(self, path: str, params: Params | None = None) -> Any:
        return await self.send(requests.get(path, params))

    async def get_text(self, path: str) -> str:
        """A non-JSON document, such as ``/metrics``."""
        response = await self.transport.send(traced(requests.get(path)))
        text = response.body.decode(errors="replace")
        if response.status >= 400:
            raise api_error(response.status, text, response.headers)
        return text

    async def create(self, path: str, body: Any, *, decode: bool = True) -> Any:
        return await self.send(requests.create(path, body, decode=decode))

    async def replace(self, path: str, body: Any) -> Any:
        return await self.send(requests.replace(path, body))

    async def patch(self, path: str, body: Any, *, content_type: str = MERGE_PATCH,
                    decode: bool = True) -> Any:
        return await self.send(requests.patch(path, body, content_type=content_type,
                                              decode=decode))

    async def server_side_apply(self, path: str, body: Any, *, field_manager: str) -> Any:
        return await self.send(requests.server_side_apply(path, body,
                                                          field_manager=field_manager))

    async def delete(self, path: str, *, params: Params | None = None, body: Any = None,
                     decode: bool = True) -> Any:
        return await self.send(requests.delete(path, body=body, params=params, decode=decode))

    def watch(self, path: str, params: Params | None = None, *,
              timeout_seconds: int = WATCH_TIMEOUT) -> AsyncIterator[Any]:
        """Watch events (dicts with ``type`` and ``object``) until the server ends the watch."""
        return self.stream(requests.watch(path, params, timeout_seconds=timeout_seconds,
                                          read_timeout=timeout_seconds + WATCH_GRACE))
