"""The seam between the kubelet API's HTTP server and the protocols a connection is upgraded to
(SPDY/3.1 for exec, attach and port-forward): what the server hands over, and what it gets.

The server parses a request's head into a :class:`Request`. For a request that asks to be
upgraded, it calls an :data:`Upgrader`, which either answers it like any request (an
:class:`~operators.engine.responding.Answer`: a refusal with the kubelet's own words) or takes
the connection over: it returns the head of the ``101 Switching Protocols`` answer and the
:class:`Session` that is fed every byte that arrives from then on, writing through the
:class:`Link` it was given.

It holds types only: no I/O, nothing of either side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import parse_qs

from operators.engine.responding import Answer


@dataclasses.dataclass(frozen=True)
class Request:
    """A request's line and headers, decoded (header names in lower case; a header given
    more than once keeps its values joined by ``, ``, as HTTP allows)."""

    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]

    @classmethod
    def parse(cls, method: bytes, target: bytes, lines: list[bytes]) -> Request:
        path, _, query = target.decode("latin-1").partition("?")
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.decode("latin-1").partition(":")
            key, text = name.strip().lower(), value.strip()
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        return cls(method.decode("latin-1"), path, parse_qs(query, keep_blank_values=True),
                   headers)

    def header_tokens(self, name: str) -> list[str]:
        """A comma-separated header's values, stripped (``Upgrade``, ``Connection``,
        ``X-Stream-Protocol-Version``)."""
        return [token.strip() for token in self.headers.get(name, "").split(",")
                if token.strip()]


class Link(Protocol):
    """What a session writes to: the connection, under the server's TLS."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class Session(Protocol):
    """What a taken-over connection feeds: every byte after the request's head."""

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Switch:
    """An upgrade accepted: the ``101`` answer's head (status line and headers, ending in
    the blank line) and the session that takes the connection over once it is written."""

    head: bytes
    session: Session


#: Decides an upgrade: ``upgrader(request, node name, link)``.
Upgrader = Callable[[Request, str, Link], "Switch | Answer"]
