"""The soak's scenario as data: its FaultPlan is one the CRD accepts, its schedule is what the
checks expect, and what it says keeps its bracketed prefix (rich would read it as markup)."""

from __future__ import annotations

import io
import socket
from pathlib import Path

from rich.console import Console

from bench import soak
from bench.workloads import Host
from operators.api.faultplans import FaultPlanSpec


def test_the_plan_is_valid_and_its_schedule_ends_before_the_quiet_minute() -> None:
    for duration, occurrences in ((180, 1), (240, 2), (1800, 15)):
        assert soak.occurrences_in(duration) == occurrences
        spec = FaultPlanSpec.model_validate(soak.plan_body(1, occurrences)["spec"])
        assert [s.repeat.times for s in spec.steps if s.repeat] == [occurrences] * 2
        moments = soak.planned(occurrences)
        assert len(moments) == 2 * occurrences
        assert max(moments[("nodes-down", k)] for k in range(occurrences)) <= \
            duration - soak.QUIET


def test_what_a_run_says_keeps_its_prefix(tmp_path: Path) -> None:
    out = io.StringIO()
    run = soak.Soak(Host(tmp_path), duration=240, kills=0, seed=1, targets=["hub"],
                    console=Console(file=out, width=200), title="with kills")
    run.say("kill [1/6]")
    assert out.getvalue().startswith("[with kills")
    assert out.getvalue().rstrip().endswith("kill [1/6]")


def test_the_state_is_kept_with_its_logs_and_without_its_sockets(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "clusters" / "a").mkdir(parents=True)
    (state / "operator.log").write_text("operator\n")
    (state / "clusters" / "a" / "engine.log").write_text("engine\n")
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(state / "hub.sock"))
    try:
        soak.keep_state(state, tmp_path / "kept" / "with-kills")
    finally:
        listening.close()
    kept = tmp_path / "kept" / "with-kills"
    assert (kept / "clusters" / "a" / "engine.log").read_text() == "engine\n"
    assert sorted(p.name for p in kept.iterdir()) == ["clusters", "operator.log"]
