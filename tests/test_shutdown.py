"""The operator lets go of everything on every way out: its daemons stop within its shutdown
grace (asked first, cancelled only after a grace of their own), a plan runner closes every
member client also when its close is cancelled, the runtime stops everything also when one stop
fails (its background work is supervised: tests/test_tasks.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from operators import __main__ as entry
from operators.handlers import registry
from operators.handlers.runtime import Runtime
from operators.k8s.client import Client
from operators.k8s.config import HostConfig
from tests.test_faultplan_runner import CORDON, World


def test_every_daemon_is_asked_to_stop_then_cancelled_within_the_shutdown_grace() -> None:
    built = registry.build_registry(HostConfig(kubeconfig=Path("/nowhere")))
    daemons = [handler for handler in built._spawning.get_all_handlers()
               if type(handler).__name__ == "DaemonHandler"]
    assert {str(handler.id) for handler in daemons} == {"run", "hub-link"}
    for handler in daemons:
        # Asked first (kopf's default cancels at once, in the middle of closing clients).
        assert handler.cancellation_backoff is not None
        assert handler.cancellation_backoff > 0
        assert handler.cancellation_timeout is not None
        stop = handler.cancellation_backoff + handler.cancellation_timeout
        assert stop < entry.SHUTDOWN_GRACE, f"{handler.id}: kopf must end it, not serve()"
    assert entry.SHUTDOWN_GRACE < 30, "fakefleet up's daemon SIGKILLs the operator after 30 s"


class SlowClose:
    """A member client whose close waits, as a session's may on a dying server."""

    def __init__(self, hangs: bool) -> None:
        self.hangs = hangs
        self.closing = False

    async def close(self) -> None:
        self.closing = True
        if self.hangs:
            await asyncio.sleep(3600)


async def test_a_runner_cancelled_while_it_closes_still_closes_every_member_client() -> None:
    world = World()
    for name in ("east", "north"):
        world.add_cluster(name)
    world.plan(CORDON)
    runner = await world.runner()
    clients = {"west": SlowClose(hangs=True), "east": SlowClose(hangs=False),
               "north": SlowClose(hangs=False)}
    runner._connect = lambda cluster, name: cast(Client, clients[name])
    await runner.clusters()
    for name in clients:
        runner.member(name)
    closing = asyncio.create_task(runner.close())
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert all(client.closing for client in clients.values())


async def test_the_runtime_stops_everything_also_when_one_stop_fails() -> None:
    stopped: list[str] = []

    class Engine:
        def __init__(self, name: str, fails: bool) -> None:
            self.name, self.fails = name, fails

        async def stop(self) -> None:
            stopped.append(self.name)
            if self.fails:
                raise OSError("cannot signal it")

    class Addon:
        async def stop_all(self) -> None:
            stopped.append("addon")

    class Cel:
        async def close(self) -> None:
            stopped.append("cel")

    runtime = Runtime(state_dir=Path("/nowhere"), host=cast(Any, None),
                      host_config=HostConfig(kubeconfig=Path("/nowhere")),
                      substrate=cast(Any, None), resolve_binaries=cast(Any, None),
                      addons=(cast(Any, Addon()),), cel=cast(Any, Cel()))
    runtime.engines = {"a": cast(Any, Engine("a", fails=True)),
                       "b": cast(Any, Engine("b", fails=False))}
    with pytest.raises(OSError, match="cannot signal it"):
        await runtime.stop_all()
    assert sorted(stopped) == ["a", "addon", "b", "cel"]
