"""``fakefleet fleet cancel-workload``: what it says of a cancel, of a workload cancelled
before, and of the hub's refusals, over a stand-in for the hub's client (the hub's side is
tested over gRPC in tests/federation/test_workloads.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import TracebackType

import grpc
import pytest
from click.testing import CliRunner

from federation.api import fleet_pb2
from operators.cli import main, workloads

RUNNING, CANCELLED = fleet_pb2.WORKLOAD_PHASE_RUNNING, fleet_pb2.WORKLOAD_PHASE_CANCELLED


class Hub:
    """The calls the command makes, answered as a hub would."""

    def __init__(self, phase: int, refusal: grpc.StatusCode | None = None) -> None:
        self.workload = fleet_pb2.Workload(id="w1a2b3c4d", name="train", phase=phase)
        self.refusal = refusal
        self.cancelled: list[str] = []

    async def __aenter__(self) -> Hub:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        return None

    async def get_workload(self, workload_id: str) -> fleet_pb2.Workload:
        copy = fleet_pb2.Workload()
        copy.CopyFrom(self.workload)
        return copy

    async def cancel_workload(self, workload_id: str) -> fleet_pb2.Workload:
        self.cancelled.append(workload_id)
        if self.refusal is not None:
            raise grpc.aio.AioRpcError(self.refusal, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details=f"workload_id: workload {workload_id} "
                                               f"Succeeded already")
        self.workload.phase, self.workload.reason = CANCELLED, "Cancelled"
        self.workload.message = "cancelled by a CancelWorkload call"
        self.workload.deleting[:] = ["east", "west"]
        self.workload.report.counts.jobs = self.workload.report.counts.cancelled = 3
        return await self.get_workload(workload_id)


def _cancel(monkeypatch: pytest.MonkeyPatch, hub: Hub, tmp_path: Path,
            *options: str) -> tuple[int, str]:
    monkeypatch.setattr(workloads, "connect", lambda *args, **options: hub)
    result = CliRunner().invoke(main, ["fleet", "cancel-workload", "w1a2b3c4d",
                                       "--state-dir", str(tmp_path), *options])
    return result.exit_code, result.output


def test_a_cancel_says_which_members_delete_the_jobs_and_shows_the_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hub = Hub(RUNNING)
    code, output = _cancel(monkeypatch, hub, tmp_path)
    assert code == 0, output
    assert hub.cancelled == ["w1a2b3c4d"]
    assert "workload w1a2b3c4d cancelled; members deleting its Jobs: east, west" in output
    assert "Cancelled (Cancelled: cancelled by a CancelWorkload call)" in output
    code, output = _cancel(monkeypatch, hub, tmp_path, "-o", "json")
    assert json.loads(output)["phase"] == "WORKLOAD_PHASE_CANCELLED"


def test_a_workload_cancelled_before_is_said_to_be(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    code, output = _cancel(monkeypatch, Hub(CANCELLED), tmp_path)
    assert code == 0, output
    assert "workload w1a2b3c4d was cancelled already" in output


def test_a_refusal_of_the_hub_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    code, output = _cancel(monkeypatch, Hub(RUNNING, grpc.StatusCode.FAILED_PRECONDITION),
                           tmp_path)
    assert code == 2
    assert output.strip() == ("Error: the hub said FAILED_PRECONDITION: workload_id: workload "
                              "w1a2b3c4d Succeeded already")
