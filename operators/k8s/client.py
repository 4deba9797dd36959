"""Raw JSON over aiohttp: the one place where fakefleet talks to Kubernetes API servers.

Hot paths (thousands of nodes, leases and pods) need no object model: requests are paths and
dicts, responses are dicts. One client holds one bounded connection pool per API server; a 429
is answered by waiting ``Retry-After`` and trying again (back-pressure instead of a pile-up).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any

import aiohttp

from operators.k8s.config import ClusterAccess
from operators.k8s.errors import TooManyRequests, TransportError, api_error

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

Params = Mapping[str, str | int]


class Client:
    """An async client of one API server."""

    def __init__(
        self,
        access: ClusterAccess,
        *,
        connections: int = 16,
        timeout: float = 30.0,
        max_throttle_retries: int = 10,
    ) -> None:
        self.server = access.server
        self._access = access
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_throttle_retries = max_throttle_retries
        self._session: aiohttp.ClientSession | None = None
        self._headers = {"Accept": "application/json"}
        if access.token:
            self._headers["Authorization"] = f"Bearer {access.token}"

    def clone(self, *, connections: int) -> Client:
        """Another client of the same server with a connection pool of its own."""
        return Client(self._access, connections=connections, timeout=self._timeout.total or 30.0,
                      max_throttle_retries=self._max_throttle_retries)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._connections, ssl=self._access.tls)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=self._headers, timeout=self._timeout
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str = "application/json",
        decode: bool = True,
    ) -> Any:
        """Send one request; return the decoded JSON body (None for an empty one, or when
        ``decode`` is off: hot-path writes need no copy of the object they wrote)."""
        data = None if body is None else json.dumps(body, separators=(",", ":"))
        headers = {"Content-Type": content_type} if data is not None else None
        for attempt in range(self._max_throttle_retries + 1):
            try:
                async with self.session.request(
                    method, self.server + path, params=params, data=data, headers=headers
                ) as response:
                    if response.status < 400 and not decode:
                        await response.read()
                        return None
                    text = await response.text()
                    if response.status < 400:
                        return json.loads(text) if text else None
                    error = api_error(response.status, text, response.headers)
            except (aiohttp.ClientError, TimeoutError) as cause:
                raise TransportError(f"{method} {self.server}{path}: {cause!r}") from cause
            if isinstance(error, TooManyRequests) and attempt < self._max_throttle_retries:
                await asyncio.sleep(error.retry_after)
                continue
            raise error
        raise AssertionError("unreachable")

    async def get(self, path: str, params: Params | None = None) -> Any:
        return await self.request("GET", path, params=params)

    async def get_text(self, path: str) -> str:
        """A non-JSON document, such as ``/metrics``."""
        try:
            async with self.session.get(self.server + path) as response:
                text = await response.text()
                if response.status >= 400:
                    raise api_error(response.status, text, response.headers)
                return text
        except (aiohttp.ClientError, TimeoutError) as cause:
            raise TransportError(f"GET {self.server}{path}: {cause!r}") from cause

    async def create(self, path: str, body: Any, *, decode: bool = True) -> Any:
        return await self.request("POST", path, body=body, decode=decode)

    async def replace(self, path: str, body: Any) -> Any:
        return await self.request("PUT", path, body=body)

    async def patch(self, path: str, body: Any, *, content_type: str = MERGE_PATCH,
                    decode: bool = True) -> Any:
        return await self.request("PATCH", path, body=body, content_type=content_type,
                                  decode=decode)

    async def delete(self, path: str, *, params: Params | None = None, body: Any = None,
                     decode: bool = True) -> Any:
        return await self.request("DELETE", path, params=params, body=body, decode=decode)

    async def watch(self, path: str, params: Params | None = None) -> AsyncIterator[Any]:
        """Stream watch events (dicts with ``type`` and ``object``) until the server ends it."""
        query = {**(params or {}), "watch": "1", "allowWatchBookmarks": "true"}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        try:
            async with self.session.get(
                self.server + path, params=query, timeout=timeout
            ) as response:
                if response.status >= 400:
                    raise api_error(response.status, await response.text(), response.headers)
                async for line in response.content:
                    if line.strip():
                        yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError) as cause:
            raise TransportError(f"watch {self.server}{path}: {cause!r}") from cause
