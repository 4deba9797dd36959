"""What the hub refuses to do, in gRPC's terms. The whole tree::

    Refused(code, message)    code: the name of a grpc.StatusCode (NOT_FOUND,
                              FAILED_PRECONDITION, PERMISSION_DENIED, ALREADY_EXISTS,
                              RESOURCE_EXHAUSTED)

Every part of the hub raises it, with a message that names the field, the value and what would
be accepted; :mod:`federation.hub.services` alone turns it into the call's status. It must not
import gRPC: the hub's parts stay apart from the wire.
"""

from __future__ import annotations


class Refused(Exception):
    """A request the hub cannot carry out; ``code`` says why in gRPC's terms."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
