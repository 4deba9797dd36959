"""Every engine test also checks that the engine sent nothing its RBAC in a member does not
grant (operators/engine/authorizing.py): the rules are exactly what it sends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.engine import harness


@pytest.fixture(autouse=True)
def engine_requests_are_granted() -> Iterator[None]:
    harness.FLEETS.clear()
    yield
    denied = sorted({f"{request.method} {request.path}" for fleet in harness.FLEETS
                     for request in fleet.engine_requests if not harness.granted(request)})
    harness.FLEETS.clear()
    assert not denied, f"the engine's RBAC does not grant: {denied}"
