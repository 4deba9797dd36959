"""The one seam between fakefleet and the network: a :class:`Transport` sends a
:class:`~operators.k8s.requests.Request` and returns the raw answer, status and bytes.

:class:`AiohttpTransport` is the production one: one bounded connection pool per API server,
TLS and credentials from a :class:`~operators.k8s.config.ClusterAccess`. Unit tests replace it
with :class:`~tests.fakes.k8s.MemoryTransport`. A transport never interprets statuses:
:mod:`operators.k8s.client` does, in one place. Failures to get an answer at all (refused,
reset, timed out) are :class:`~operators.k8s.errors.TransportError`.

An API server named by a tenant's kubeconfig (an adopted cluster: ``ClusterAccess.untrusted``)
may answer anything: its bodies, and each line of its watches, are read up to
:data:`UNTRUSTED_MAX_BODY` and no further (a TransportError names the limit), so that one
adopted cluster cannot fill the operator's memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import aiohttp

from operators.k8s.config import ClusterAccess
from operators.k8s.errors import TransportError
from operators.k8s.requests import Request
from primitives.clocks import SYSTEM_CLOCK, Clock

#: How long an Authorization header is reused before asking the credentials again (tokens from
#: files and exec plugins rotate; asking on every request would cost a lock and a clock read).
CREDENTIALS_TTL = 30.0
#: The largest answer (or watch event) read from an untrusted API server: a list of 10,000
#: pods is about 40 MiB.
UNTRUSTED_MAX_BODY = 64 << 20


class TooLarge(TransportError):
    """An answer longer than the transport reads."""


def _amount(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size} bytes"


async def read_capped(chunks: AsyncIterator[bytes], limit: int | None, *,
                      what: str) -> bytes:
    """The whole of ``chunks``, or TooLarge once it passes ``limit`` bytes (None: no limit)."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if limit is not None and len(body) > limit:
            raise TooLarge(f"{what}: the answer is larger than {_amount(limit)}, the most read "
                           f"from an adopted cluster's API server")
    return bytes(body)


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


class StreamResponse(Protocol):
    """An answer read line by line (a watch)."""

    status: int
    headers: Mapping[str, str]

    async def read(self) -> bytes:
        """The whole body (for an error status)."""
        ...

    def lines(self) -> AsyncIterator[bytes]:
        """Each newline-delimited line, however long, without the newline."""
        ...


class Transport(Protocol):
    async def send(self, request: Request) -> Response: ...

    def stream(self, request: Request) -> contextlib.AbstractAsyncContextManager[
        StreamResponse]: ...

    def refresh_credentials(self) -> None:
        """Forget cached credentials (after a 401): the next request asks for fresh ones."""
        ...

    async def close(self) -> None: ...


async def split_lines(chunks: AsyncIterator[bytes], *,
                      limit: int | None = None) -> AsyncIterator[bytes]:
    """Lines of a byte stream, up to ``limit`` bytes each (None: no limit; a watch event is one
    line, and an object may be as large as the API server stores: aiohttp's line reader stops
    at 128 KiB). TooLarge for a longer one."""
    buffer = bytearray()
    async for chunk in chunks:
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            if end > start:
                yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if limit is not None and len(buffer) > limit:  # a line not ended yet
            raise TooLarge(f"a watch event larger than {_amount(limit)}, the most read from an "
                           f"adopted cluster's API server")
    if buffer.strip():
        yield bytes(buffer)


class _AiohttpStream:
    def __init__(self, response: aiohttp.ClientResponse, limit: int | None) -> None:
        self._response = response
        self._limit = limit
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers

    async def read(self) -> bytes:
        return await read_capped(self._response.content.iter_any(), self._limit,
                                 what=str(self._response.url))

    async def lines(self) -> AsyncIterator[bytes]:
        async for line in split_lines(self._response.content.iter_any(), limit=self._limit):
            yield line


class AiohttpTransport:
    """Requests over one aiohttp connection pool (``connections`` at most at once)."""

    def __init__(self, access: ClusterAccess, *, connections: int = 16,
                 timeout: float = 30.0) -> None:
        self.server = access.server
        self._access = access
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        #: The most read of one answer (None: no limit, for servers of our own).
        self.max_body = UNTRUSTED_MAX_BODY if access.untrusted else None
        self._authorization: str | None = None
        self._asked_at = -CREDENTIALS_TTL

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._connections, ssl=self._access.tls())
            self._session = aiohttp.ClientSession(
                connector=connector, headers={"Accept": "application/json"},
                timeout=self._timeout)
        return self._session

    def refresh_credentials(self) -> None:
        self._asked_at = -CREDENTIALS_TTL
        if self._access.forget is not None:
            self._access.forget()

    def _headers(self, request: Request) -> dict[str, str]:
        now = time.monotonic()
        if now - self._asked_at >= CREDENTIALS_TTL:
            self._authorization = self._access.authorization()
            self._asked_at = now
        headers = {}
        if self._authorization:
            headers["Authorization"] = self._authorization
        if request.content_type is not None:
            headers["Content-Type"] = request.content_type
        headers.update(request.headers)
        return headers

    def _describe(self, request: Request) -> str:
        return f"{request.method} {self.server}{request.path}"

    async def send(self, request: Request) -> Response:
        try:
            async with self.session.request(
                request.method, self.server + request.path, params=request.params or None,
                data=request.body, headers=self._headers(request),
                server_hostname=self._access.tls_server_name,
            ) as response:
                if self.max_body is not None and (response.content_length or 0) > self.max_body:
                    raise TooLarge(f"{self._describe(request)}: the answer has "
                                   f"{response.content_length} bytes, more than the "
                                   f"{_amount(self.max_body)} read from an adopted cluster's "
                                   f"API server")
                body = await read_capped(response.content.iter_any(), self.max_body,
                                         what=self._describe(request))
                return Response(response.status, response.headers, body)
        except (aiohttp.ClientError, TimeoutError) as cause:
            raise TransportError(f"{self._describe(request)}: {cause!r}") from cause

    @contextlib.asynccontextmanager
    async def stream(self, request: Request) -> AsyncIterator[StreamResponse]:
        timeout = aiohttp.ClientTimeout(total=None, sock_read=request.read_timeout)
        try:
            async with self.session.request(
                request.method, self.server + request.path, params=request.params or None,
                headers=self._headers(request), timeout=timeout,
                server_hostname=self._access.tls_server_name,
            ) as response:
                yield _AiohttpStream(response, self.max_body)
        except (aiohttp.ClientError, TimeoutError) as cause:
            raise TransportError(f"{self._describe(request)}: {cause!r}") from cause

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class SlowWrites:
    """Another transport whose writes each wait ``delay`` seconds first: a slow API server, as
    an APIServerSlow fault makes it for one engine (reads and watches are not held up)."""

    def __init__(self, inner: Transport, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.inner = inner
        self.delay = 0.0
        self._clock = clock

    async def send(self, request: Request) -> Response:
        if self.delay > 0 and request.method != "GET":
            await self._clock.sleep(self.delay)
        return await self.inner.send(request)

    def stream(self, request: Request) -> contextlib.AbstractAsyncContextManager[
            StreamResponse]:
        return self.inner.stream(request)

    def refresh_credentials(self) -> None:
        self.inner.refresh_credentials()

    async def close(self) -> None:
        await self.inner.close()
