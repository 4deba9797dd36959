"""``fakefleet replay``'s command line (operators/cli/replays.py): its speed, the trace file
reader it expects, and the exit code of a replay that cannot start."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from operators.cli import main
from operators.cli.replays import ReplayError, load
from operators.recording import planning
from operators.recording.trace import Trace

TRACE = Trace(("c1",), "2026-01-01T00:00:00Z", 0)


@pytest.mark.parametrize(("given", "speed"), [("10", 10.0), ("max", 0.0), ("0", 0.0),
                                              ("0.5", 0.5)])
def test_speed_is_a_factor_or_max(given: str, speed: float, monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path) -> None:
    seen: list[float] = []

    def planned(trace: Trace, options: planning.Options) -> planning.Plan:
        seen.append(options.speed)
        raise ReplayError("stop here")
    monkeypatch.setattr("operators.cli.replays.load", lambda path: TRACE)
    monkeypatch.setattr("operators.cli.replays.planning.plan", planned)
    (tmp_path / "t").write_text("")
    CliRunner().invoke(main, ["replay", str(tmp_path / "t"), "--into", "w", "--speed", given])
    assert seen == [speed]


@pytest.mark.parametrize("given", ["-1", "nan", "inf", "fast", "0.0001"])
def test_a_speed_out_of_range_is_refused_with_what_is_accepted(given: str,
                                                               tmp_path: Path) -> None:
    (tmp_path / "t").write_text("")
    done = CliRunner().invoke(main, ["replay", str(tmp_path / "t"), "--into", "w",
                                     "--speed", given])
    assert done.exit_code == 2
    assert "or max (0)" in done.output


def test_load_reads_with_the_trace_files_reader(monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    """The wiring the record side's reader merges into: read(path: Path) -> Trace."""
    files = types.ModuleType("operators.recording.files")
    files.read = lambda path: TRACE if path == tmp_path / "t" else None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "operators.recording.files", files)
    assert load(tmp_path / "t") is TRACE

    def bad(path: Path) -> Trace:
        raise ValueError("version 9 is newer than this fakefleet reads")
    files.read = bad  # type: ignore[attr-defined]
    with pytest.raises(ReplayError, match=r"t: version 9 is newer"):
        load(tmp_path / "t")


def test_a_trace_that_cannot_be_planned_exits_2_naming_the_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("operators.cli.replays.load",
                        lambda path: Trace(("a", "b"), "2026-01-01T00:00:00Z", 0))
    (tmp_path / "t").write_text("")
    done = CliRunner().invoke(main, ["replay", str(tmp_path / "t"), "--into", "w"])
    assert done.exit_code == 2
    assert "holds 2 clusters (a, b): name the one to replay (--from)" in done.output
