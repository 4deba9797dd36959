"""``fakefleet replay``'s command line (operators/cli/replays.py): its speed, the trace file
it reads, and the exit code of a replay that cannot start."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from operators.cli import main, replays
from operators.cli.replays import ReplayError, load
from operators.recording import files, planning, replaying
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


def test_load_reads_a_trace_file_and_names_a_truncated_one(tmp_path: Path) -> None:
    files.write(tmp_path / "t", TRACE)
    assert load(tmp_path / "t") == TRACE

    (tmp_path / "cut").write_bytes((tmp_path / "t").read_bytes()[:-5])
    with pytest.raises(ReplayError, match=r"cut is truncated"):
        load(tmp_path / "cut")


def test_a_trace_that_cannot_be_planned_exits_2_naming_the_file(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("operators.cli.replays.load",
                        lambda path: Trace(("a", "b"), "2026-01-01T00:00:00Z", 0))
    (tmp_path / "t").write_text("")
    done = CliRunner().invoke(main, ["replay", str(tmp_path / "t"), "--into", "w"])
    assert done.exit_code == 2
    assert "holds 2 clusters (a, b): name the one to replay (--from)" in done.output


def test_the_summary_names_what_a_create_if_missing_found_standing(
        capsys: pytest.CaptureFixture[str]) -> None:
    write = planning.Write(0.0, "create", "v1", "Namespace", "namespaces", "", "shop", {},
                           if_missing=True)
    replays._summary(replaying.Progress(total=1, applied=1, lags=[0.0], present=[write]), 1.0)
    said = capsys.readouterr().err
    assert "replayed 1 of 1 writes" in said
    assert "already in the cluster, left as they stood: Namespace shop" in said
