"""The daemon's host.json on a full disk: a failed write never stops the control plane."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path
from typing import Any

import pytest

from operators.controlplane import daemon
from operators.controlplane.state import HostState


async def test_a_full_disk_is_logged_once_and_publishing_carries_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "host.json"
    real = daemon.publish
    rounds: list[int] = []
    stop = asyncio.Event()

    def publish(at: Path, state: Any) -> None:
        rounds.append(len(rounds))
        if len(rounds) <= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(at, state)
        if len(rounds) == 5:
            stop.set()

    monkeypatch.setattr(daemon, "publish", publish)
    with caplog.at_level(logging.INFO, logger=daemon.__name__):
        await asyncio.wait_for(daemon.keep_publishing(
            path, lambda: HostState(pid=1, ready=True), stop_flag=stop, interval=0.001), 5)

    assert len(rounds) == 5, "every round after the failures was tried"
    assert HostState.model_validate_json(path.read_text()).ready
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "one line for the same failure, not one per second"
    assert "No space left on device" in errors[0].getMessage()
    assert any("published again" in r.getMessage() for r in caplog.records)
