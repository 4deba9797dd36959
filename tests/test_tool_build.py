"""An add-on's binary built in the background: once for all members, its failure reported and
tried again later, an override that names no binary reported at once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from operators.addons import building
from operators.addons.building import ToolBuild
from operators.controlplane.errors import BinaryError, BuildError


async def test_one_build_runs_however_often_it_is_started(tmp_path: Path) -> None:
    built: list[Path] = []
    release = threading.Event()
    binary = tmp_path / "tool"

    def ensure(**_: Any) -> Path:
        release.wait(5)
        binary.write_text("")
        built.append(binary)
        return binary

    build = ToolBuild("Tool", lambda: binary if binary.exists() else None, ensure)
    assert build.observe() == (False, "", None)
    build.start()
    build.start()
    found, error, running = build.observe()
    assert (found, error) == (False, "")
    assert running is not None
    assert running >= 0
    release.set()
    assert build.future is not None
    assert await build.future == binary
    assert build.observe() == (True, "", None)
    assert built == [binary]


async def test_a_failed_build_is_reported_then_forgotten_so_that_it_is_tried_again() -> None:
    def ensure(**_: Any) -> Path:
        raise BuildError("go install failed: no such host")

    build = ToolBuild("Tool", lambda: None, ensure)
    build.start()
    assert build.future is not None
    with pytest.raises(BuildError):
        await build.future
    await asyncio.sleep(0)  # the done callback
    assert build.observe() == (False, "go install failed: no such host", None)
    build.failed_at -= building.BUILD_RETRY + 1  # as if it failed that long ago
    assert build.observe() == (False, "", None)


def test_an_override_that_names_no_binary_is_the_reason() -> None:
    def find() -> Path | None:
        raise BinaryError("FAKEFLEET_TOOL=/nowhere does not name an executable tool binary")

    build = ToolBuild("Tool", find, lambda **_: Path("/unused"))
    assert build.observe() == (
        False, "FAKEFLEET_TOOL=/nowhere does not name an executable tool binary", None)


async def test_a_build_that_fails_unexpectedly_is_logged_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    def ensure(**_: Any) -> Path:
        raise KeyError("a defect, not a failed go command")

    build = ToolBuild("Tool", lambda: None, ensure)
    with caplog.at_level("ERROR", logger="operators.addons.building"):
        build.start()
        assert build.future is not None
        with pytest.raises(KeyError):
            await build.future
        await asyncio.sleep(0)  # the done callback
    (record,) = [r for r in caplog.records if "building Tool failed" in r.getMessage()]
    assert record.exc_info is not None, "with its traceback"
    assert build.observe()[1] == "'a defect, not a failed go command'"
