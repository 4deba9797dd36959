"""What the handlers work with, passed to them through kopf's ``memo`` (never globals)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from operators.controlplane.binaries import Binaries
from operators.controlplane.substrate import Substrate
from operators.engine.fleet import EngineFleet
from operators.k8s.client import Client
from operators.k8s.config import ClusterAccess


@dataclasses.dataclass
class Runtime:
    """The operator's dependencies and its in-memory view of the member clusters."""

    state_dir: Path
    host: Client
    substrate: Substrate
    engines: EngineFleet
    resolve_binaries: Callable[[str], Binaries]
    external: dict[str, ClusterAccess] = dataclasses.field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = dataclasses.field(default_factory=dict)

    def lock(self, key: str) -> asyncio.Lock:
        """One reconciliation at a time per object (change handlers and timers overlap)."""
        return self.locks.setdefault(key, asyncio.Lock())


async def wait_until_none(count: Callable[[], int], timeout: float) -> int:
    """Poll ``count`` (say, an engine's nodes still being deleted) until it is 0 or ``timeout``
    seconds passed; what is left."""
    deadline = time.monotonic() + timeout
    while (left := count()) and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    return left
