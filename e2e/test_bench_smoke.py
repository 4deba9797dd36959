"""The engine, DRA, HPA and `kubectl logs` benchmarks at toy size, so their harnesses cannot
rot.

They assert that every phase completed (every node Ready, every pod Running, every pod gone;
for DRA every slice published and every claim allocated; every pod's log read), for fakefleet
and for KWOK; they do not judge speed: figures come from `make bench`. The HPA harness runs
one round at the shortest scrape interval (1 s): the same steps, with less waiting for
Prometheus.
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


def test_dra_benchmark_harness_publishes_allocates_and_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "dra.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.dra", "--nodes", "3", "--pods", "4", "--gpus-per-claim",
         "2", "--output", str(out)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent.parent,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = json.loads(out.read_text())["run"]
    assert [phase["name"] for phase in run["phases"]] == [
        "nodes Ready, slices published", "claims allocated, pods Running",
        "pods and claims deleted"]
    assert all(phase["seconds"] is not None for phase in run["phases"])
    assert run["phases"][0]["writes"]["POST resourceslices"] == 3, "one slice per node, once"
    assert run["slice_bytes"] > 0
    assert run["engine_peak_rss_mib"] > 0


def test_hpa_benchmark_harness_times_both_steps_and_the_path_s_processes(tmp_path: Path) -> None:
    out = tmp_path / "hpa.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.hpa", "--rounds", "1", "--scrape-interval", "1s",
         "--unsafe-no-fsync", "--output", str(out)],
        capture_output=True, text=True, timeout=900, cwd=Path(__file__).parent.parent,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = json.loads(out.read_text())
    assert [step["name"] for step in run["steps"]] == [
        "up 1: 2 x 20 -> 4 replicas", "down 1: 4 x 5 -> 2 replicas"]
    assert all(step["seconds"] is not None for step in run["steps"])
    assert set(run["processes"]) == {"prometheus", "custom-metrics-adapter", "engine"}
    assert all(usage["rss_mib"] > 0 for usage in run["processes"].values())
    assert run["tsdb_bytes"] > 0


def test_kubectl_logs_benchmark_harness_reads_every_pod_s_log(tmp_path: Path) -> None:
    out = tmp_path / "kubeletlogs.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.kubeletlogs", "--nodes", "3", "--kubectl", "2",
         "--output", str(out)],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).parent.parent,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    run = json.loads(out.read_text())["run"]
    assert [(found["name"], found["requests"], found["failures"]) for found in run["passes"]] == [
        ("API, first contact (new TLS)", 3, 0), ("API, kept connections", 3, 0),
        ("kubectl logs (process included)", 2, 0)]
    assert run["engine_peak_rss_mib"] > 0
