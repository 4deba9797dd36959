"""The engine benchmark at toy size, both engines, so its harness cannot rot.

It asserts that every phase completed (every node Ready, every pod Running, every pod gone) for
fakefleet and for KWOK; it does not judge speed: figures come from `make bench`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_benchmark_harness_runs_both_engines(tmp_path: Path) -> None:
    out = tmp_path / "engines.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.engines", "--nodes", "10", "--pods", "30",
         "--engines", "fakefleet,kwok", "--output", str(out)],
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).parent.parent,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert set(runs) == {"fakefleet", "kwok"}
    for engine, run in runs.items():
        names = [phase["name"] for phase in run["phases"]]
        assert names == ["nodes Ready", "pods Running (bound)", "pods deleted (bound)",
                         "pods Running (scheduled)", "pods deleted (scheduled)"], engine
        for phase in run["phases"]:
            assert phase["seconds"] is not None, f"{engine}: {phase['name']} did not complete"
        assert run["peak_rss_mib"] > 0
    assert "fakefleet/kwok" in result.stdout
