"""Errors of the Kubernetes API boundary, translated from HTTP in one place (:func:`api_error`).

    K8sError
    ├── ConfigError          a kubeconfig that cannot be used (the message says which field)
    ├── NotOwned             an object fakefleet writes by name exists and is not fakefleet's
    ├── TransportError       no answer: connection refused/reset, timeout, a broken stream
    └── ApiError             the API server answered with a Status (status, reason, message)
        ├── BadRequest       400
        ├── Unauthorized     401 / 403
        ├── NotFound         404
        ├── Conflict         409 (reason AlreadyExists or Conflict)
        ├── Gone             410: the watch's resourceVersion is too old; relist
        ├── Invalid          422: the message names the field
        ├── TooManyRequests  429: carries retry_after seconds
        └── ServerError      5xx
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

#: How much of an answer that is no Kubernetes Status an error quotes.
QUOTED_BODY = 200
#: How long a message about an error may be where a user reads it (a status).
BRIEF = 512

_SECRETS = (
    # user:password@ in a URL
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@"), r"\1***@"),
    # Authorization headers and bearer tokens
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+"), r"\1 ***"),
    # token=..., password: ..., "client-key-data": "..."
    (re.compile(r"(?i)([\"']?\b(?:[a-z-]*token|password|passwd|secret|[a-z-]*key-data|"
                r"authorization)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}&]+"), r"\1***"),
)


class K8sError(Exception):
    """Base of every error raised by :mod:`operators.k8s`."""


class ConfigError(K8sError):
    """A kubeconfig is malformed, incomplete, or asks for what fakefleet refuses to do."""


class NotOwned(K8sError):
    """An object fakefleet would write (or delete) by name exists, and fakefleet did not make
    it: it is left untouched (:mod:`operators.k8s.owning`)."""

    def __init__(self, message: str, *, kind: str, namespace: str, name: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.namespace = namespace
        self.name = name


class TransportError(K8sError):
    """The API server could not be reached, did not answer in time, or broke off a stream."""


class ApiError(K8sError):
    """The API server answered with an error Status."""

    def __init__(self, status: int, reason: str, message: str, body: Any = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(ApiError):
    pass


class Invalid(ApiError):
    pass


class TooManyRequests(ApiError):
    def __init__(self, status: int, reason: str, message: str, body: Any = None,
                 retry_after: float = 1.0) -> None:
        super().__init__(status, reason, message, body)
        self.retry_after = retry_after


class ServerError(ApiError):
    pass


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthorized, 403: Unauthorized, 404: NotFound, 409: Conflict,
    410: Gone, 422: Invalid,
}


def api_error(status: int, text: str, headers: Mapping[str, str]) -> ApiError:
    """Build the right :class:`ApiError` from an HTTP error response."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or quoted(text))
    else:
        reason, message = "", quoted(text)
    if status == 429:
        try:
            retry_after = float(headers.get("Retry-After", "1"))
        except ValueError:
            retry_after = 1.0
        return TooManyRequests(status, reason or "TooManyRequests", message, body, retry_after)
    if status >= 500:
        return ServerError(status, reason or "InternalError", message, body)
    return _BY_STATUS.get(status, ApiError)(status, reason, message, body)


def quoted(text: str) -> str:
    """An answer that is no Kubernetes Status (a proxy's HTML page, say), as an error quotes
    it: the start of it, on one line, and how long it was."""
    flat = " ".join(text.split())
    if len(flat) <= QUOTED_BODY:
        return flat
    return f"{flat[:QUOTED_BODY]}... ({len(text.encode())} bytes)"


def brief(error: BaseException | str, limit: int = BRIEF) -> str:
    """An error as a status may say it: one line of printable text, credentials masked
    (passwords in URLs, bearer tokens, token=... and key data), at most ``limit``
    characters."""
    text = "".join(c if c.isprintable() else " " for c in str(error))
    text = " ".join(text.split())
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def transient(error: K8sError) -> bool:
    """Worth sending again unchanged: no answer, throttled, or an error of the server's own."""
    return isinstance(error, TransportError | TooManyRequests | ServerError)
