"""Detached children with real (tiny) processes: started under a child subreaper, they
outlive the process that started them, are adopted by its successor, die with the subreaper
(even SIGKILLed), and are stopped by it when it stops. The subreaper reaps them without taking
the exit codes of its own children."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from operators.controlplane import detaching, reaping
from operators.controlplane.processes import identify, stat
from operators.controlplane.supervising import Supervised


def _alive(pid: int) -> bool:
    found = stat(pid)
    return found is not None and not found.zombie


def _eventually(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what or predicate}"
        time.sleep(0.02)
    return result


@pytest.fixture
def subreaper() -> Iterator[int]:
    """This test process as the child subreaper, for one test."""
    reaping.become_subreaper()
    try:
        yield os.getpid()
    finally:
        reaping.become_subreaper(False)
        time.sleep(0.05)
        reaping.reap(lambda: frozenset())


def test_orphans_are_reaped_and_own_children_left_to_their_waiter(subreaper: int) -> None:
    own = subprocess.Popen(["sh", "-c", "exit 3"])
    starter = subprocess.Popen(["sh", "-c", "sleep 0.1 & echo $!"], stdout=subprocess.PIPE,
                               text=True)
    assert starter.stdout is not None
    orphan = int(starter.stdout.read())
    starter.stdout.close()
    assert starter.wait() == 0
    _eventually(lambda: (found := stat(orphan)) is not None and found.zombie,
                what="the orphan to exit")
    _eventually(lambda: (found := stat(own.pid)) is not None and found.zombie,
                what="the own child to exit")
    reaped = _eventually(lambda: reaping.reap(lambda: frozenset({own.pid})))
    assert reaped == [orphan]
    assert stat(orphan) is None
    assert own.wait() == 3, "its exit code is still there for its waiter"


def test_reaping_waits_while_a_child_is_being_started(subreaper: int) -> None:
    starter = subprocess.Popen(["sh", "-c", "true &"])
    starter.wait()
    time.sleep(0.1)
    assert reaping.reap(lambda: None) == []


async def test_a_detached_child_is_the_subreapers_recorded_before_it_runs(
        tmp_path: Path, subreaper: int) -> None:
    child = Supervised("sleeper", ["sleep", "60"], log_path=tmp_path / "sleeper.log",
                       subreaper=subreaper, min_backoff=0.05)
    await child.start()
    try:
        pid = child.pid
        assert pid is not None
        found = stat(pid)
        assert found is not None
        assert found.parent == subreaper, "reparented to the subreaper"
        recorded = detaching.read_record(child.record)
        assert recorded is not None
        assert recorded.pid == pid
        assert recorded.argv == ("sleep", "60")
        identity = _eventually(lambda: (i := identify(pid)) and i.argv == recorded.argv and i)
        assert identity.start_time == recorded.start_time
        os.kill(pid, signal.SIGKILL)  # a crash: seen through the pidfd, started again
        await asyncio.to_thread(_eventually, lambda: child.pid not in (None, pid))
        assert child.restarts == 1
        assert detaching.read_record(child.record).pid == child.pid  # type: ignore[union-attr]
        await asyncio.to_thread(_eventually, lambda: pid in reaping.reap(lambda: frozenset()))
    finally:
        await child.stop(timeout=5)
    assert not child.record.exists()


async def test_a_detached_child_never_runs_unrecorded(tmp_path: Path, subreaper: int) -> None:
    child = Supervised("sleeper", ["sleep", "61.25"], log_path=tmp_path / "sleeper.log",
                       subreaper=subreaper)
    child.record.mkdir()  # the record cannot be written
    with pytest.raises(IsADirectoryError):
        await child.start()
    await asyncio.sleep(0.3)
    running = [entry for entry in Path("/proc").iterdir() if entry.name.isdigit()
               and (identity := identify(int(entry.name))) is not None
               and identity.argv == ("sleep", "61.25")]
    assert running == []


REAPER = """
import asyncio, os, signal, sys
from pathlib import Path
from operators.controlplane import detaching, reaping
from operators.controlplane.processes import own_children
from operators.controlplane.supervising import Supervised

async def main():
    reaping.become_subreaper()
    keeper = asyncio.create_task(reaping.keep_reaping(own_children, interval=0.05))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    operator = Supervised("operator", [sys.executable, {operator!r}],
                          log_path=Path({directory!r}) / "operator.log", min_backoff=0.05,
                          env={{detaching.SUBREAPER: str(os.getpid())}})
    await operator.start()
    await stop.wait()
    await operator.stop()
    print(await reaping.stop_orphans(own_children, timeout=5), flush=True)
    keeper.cancel()

asyncio.run(main())
"""

OPERATOR = """
import asyncio, json, os
from pathlib import Path
from operators.controlplane import detaching
from operators.controlplane.supervising import Supervised

async def main():
    child = Supervised("sleeper", ["sleep", "600"], log_path=Path({directory!r}) / "sleeper.log",
                       subreaper=detaching.subreaper(os.environ, os.getppid()))
    if not await child.adopt():
        await child.start()
    report = {{"operator": os.getpid(), "child": child.pid, "adopted": child.adopted}}
    (Path({directory!r}) / f"operator-{{os.getpid()}}.json").write_text(json.dumps(report))
    await asyncio.sleep(600)

asyncio.run(main())
"""


class World:
    """A subreaper (the daemon) that supervises an operator, which starts one detached child."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        operator = directory / "operator.py"
        operator.write_text(OPERATOR.format(directory=str(directory)))
        reaper = directory / "reaper.py"
        reaper.write_text(REAPER.format(operator=str(operator), directory=str(directory)))
        self.reaper = subprocess.Popen([sys.executable, str(reaper)], stdout=subprocess.PIPE,
                                       text=True, start_new_session=True)

    def operator(self, other_than: int = 0) -> dict[str, Any]:
        def reported() -> dict[str, Any] | None:
            for path in self.directory.glob("operator-*.json"):
                report: dict[str, Any] = json.loads(path.read_text())
                if report["operator"] != other_than:
                    return report
            return None
        found: dict[str, Any] = _eventually(reported, timeout=20, what="an operator's report")
        (self.directory / f"operator-{found['operator']}.json").unlink()
        return found

    def close(self) -> None:
        if self.reaper.poll() is None:
            self.reaper.kill()
        self.reaper.wait()
        assert self.reaper.stdout is not None
        self.reaper.stdout.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    world = World(tmp_path)
    try:
        yield world
    finally:
        world.close()


def test_a_detached_child_outlives_a_killed_operator_and_is_adopted(world: World) -> None:
    first = world.operator()
    child = first["child"]
    assert not first["adopted"]
    assert stat(child).parent == world.reaper.pid  # type: ignore[union-attr]
    os.kill(first["operator"], signal.SIGKILL)
    second = world.operator(other_than=first["operator"])
    assert second == {"operator": second["operator"], "child": child, "adopted": True}
    assert _alive(child)


def test_a_detached_child_dies_with_a_killed_subreaper(world: World) -> None:
    first = world.operator()
    os.kill(first["operator"], signal.SIGKILL)
    world.operator(other_than=first["operator"])
    world.reaper.kill()
    _eventually(lambda: not _alive(first["child"]), what="the child to die with the subreaper")


def test_a_stopping_subreaper_stops_what_the_operator_left(world: World) -> None:
    first = world.operator()
    os.kill(first["operator"], signal.SIGKILL)
    second = world.operator(other_than=first["operator"])
    world.reaper.send_signal(signal.SIGTERM)
    assert world.reaper.stdout is not None
    assert world.reaper.stdout.readline().strip() == "1", "the one member left"
    assert world.reaper.wait(timeout=20) == 0
    assert not _alive(first["child"])
    assert not _alive(second["operator"])
