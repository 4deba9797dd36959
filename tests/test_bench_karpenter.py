"""bench.karpenter: Karpenter's own account read back from its log and its metrics port (lines
and series as v1.14.1 writes them), and the moments its watches record."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console

from bench.karpenter import (
    SideRun,
    Stamps,
    condition,
    last_pods_table,
    log_figures,
    metric_figures,
    provisioned,
    requests_table,
    settled,
)


def entry(message: str, **fields: Any) -> str:
    return json.dumps({"level": "INFO", "time": "2026-12-03T12:50:01.123Z",
                       "logger": "controller", "message": message, "commit": "",
                       "controller": "provisioner", **fields})


def test_provisioning_rounds_and_their_simulations_come_from_the_log() -> None:
    log = "\n".join([
        "Unable to read vcs.revision",  # not JSON: Karpenter prints it before its logger
        entry("computed new nodeclaim(s) to fit pod(s)", nodeclaims=30, pods=30),
        entry("found provisionable pod(s)", Pods="default/gpu-0 and 29 other(s)",
              duration="812.5ms"),
        entry("created nodeclaim", NodeClaim={"name": "gpu-abcde"}),
        entry("computed new nodeclaim(s) to fit pod(s)", nodeclaims=10, pods=10),
        entry("found provisionable pod(s)", Pods="default/gpu-30", duration="1.5s"),
    ])
    assert log_figures(log) == {
        "provisioning rounds (log)": 2, "NodeClaims computed (log)": 40,
        "scheduling simulation s, sum (log)": pytest.approx(2.312),
        "scheduling simulation s, longest (log)": 1.5}


def test_a_log_without_a_round_has_none() -> None:
    figures = log_figures(entry("Starting workers", **{"worker count": 10}))
    assert figures["provisioning rounds (log)"] == 0
    assert figures["scheduling simulation s, longest (log)"] is None


METRICS = """\
# HELP karpenter_nodeclaims_created_total Number of nodeclaims created in total by Karpenter.
# TYPE karpenter_nodeclaims_created_total counter
karpenter_nodeclaims_created_total{nodepool="gpu",reason="provisioned",zone="zone-a"} 25
karpenter_nodeclaims_created_total{nodepool="gpu",reason="provisioned",zone="zone-b"} 15
# HELP karpenter_pods_scheduling_decision_duration_seconds The time it takes.
# TYPE karpenter_pods_scheduling_decision_duration_seconds histogram
karpenter_pods_scheduling_decision_duration_seconds_bucket{le="+Inf"} 40
karpenter_pods_scheduling_decision_duration_seconds_sum 90
karpenter_pods_scheduling_decision_duration_seconds_count 40
# HELP karpenter_pods_startup_duration_seconds The time from pod creation until running.
# TYPE karpenter_pods_startup_duration_seconds summary
karpenter_pods_startup_duration_seconds{quantile="0"} 4.1
karpenter_pods_startup_duration_seconds{quantile="0.5"} 9.504
karpenter_pods_startup_duration_seconds{quantile="0.9"} 12
karpenter_pods_startup_duration_seconds{quantile="0.99"} 14.8
karpenter_pods_startup_duration_seconds{quantile="1"} 15.2
karpenter_pods_startup_duration_seconds_sum 380
karpenter_pods_startup_duration_seconds_count 40
# HELP karpenter_nodes_termination_duration_seconds Deletion to finalizer removed.
# TYPE karpenter_nodes_termination_duration_seconds summary
karpenter_nodes_termination_duration_seconds{nodepool="gpu",quantile="0.5"} 6.2
karpenter_nodes_termination_duration_seconds{nodepool="gpu",quantile="1"} 8.75
karpenter_nodes_termination_duration_seconds_sum{nodepool="gpu"} 250
karpenter_nodes_termination_duration_seconds_count{nodepool="gpu"} 40
# HELP karpenter_voluntary_disruption_decisions_total Number of disruption decisions.
# TYPE karpenter_voluntary_disruption_decisions_total counter
karpenter_voluntary_disruption_decisions_total{decision="delete",reason="empty"} 1
"""


def test_scale_up_figures_come_from_karpenter_s_own_series() -> None:
    assert metric_figures(METRICS, scaled_down=False) == {
        "NodeClaims created (metric)": 40,
        "pod seen → first scheduling try, mean s (metric)": 2.25,
        "pod created → Running p50 s (metric)": 9.5,
        "pod created → Running p99 s (metric)": 14.8,
        "pod created → Running max s (metric)": 15.2}


def test_scale_down_figures_come_from_karpenter_s_own_series() -> None:
    assert metric_figures(METRICS, scaled_down=True) == {
        "node deletion → finalizer removed p50 s (metric)": 6.2,
        "node deletion → finalizer removed max s (metric)": 8.75,
        "disruption decisions (metric)": 1}


def test_a_summary_with_no_observation_yet_says_nothing() -> None:
    empty = ('# TYPE karpenter_pods_startup_duration_seconds summary\n'
             'karpenter_pods_startup_duration_seconds{quantile="0.5"} NaN\n')
    assert metric_figures(empty, scaled_down=False)["pod created → Running p50 s (metric)"] \
        is None


def node(name: str, provider: str, ready: bool | None = None) -> dict[str, Any]:
    status = {} if ready is None else {"conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}
    return {"metadata": {"name": name}, "spec": {"providerID": provider}, "status": status}


def test_stamps_record_each_mark_once_and_what_went(monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter(float(second) for second in range(100, 200))
    monkeypatch.setattr("bench.karpenter.time.time", lambda: next(now))
    stamps = Stamps(None, "/api/v1/nodes", {"ready": condition("Ready")},  # type: ignore[arg-type]
                    keep=provisioned)
    stamps._relisted([node("a", "kwok://a"), node("other", "fakefleet://bench/cpu-0", True)])
    stamps._event("MODIFIED", node("a", "kwok://a", ready=True))     # 101
    stamps._event("ADDED", node("b", "kwok://b", ready=False))       # 102
    stamps._event("MODIFIED", node("a", "kwok://a", ready=True))     # 103: already Ready
    assert stamps.live == {"a", "b"}, "only Karpenter's nodes are watched"
    assert stamps.stamps["a"] == {"seen": 100.0, "ready": 101.0}
    assert stamps.count("ready") == 1
    stamps._event("DELETED", node("a", "kwok://a", ready=True))      # 104
    stamps._relisted([])                                             # 105: b went unseen
    assert stamps.live == set()
    assert sorted(stamps.times("gone")) == [104.0, 105.0]
    assert stamps.times("ready") == [101.0], "a node gone keeps its moments"


def test_the_requests_table_says_each_side_s_requests_in_all_and_per_nodeclaim() -> None:
    ours = SideRun("fakefleet", 1, nodeclaims=100,
                   requests={"PATCH leases": 740, "POST pods": 100},
                   flows={"exempt": 3900, "system-node-high": 1191})
    theirs = SideRun("kwok", 1, nodeclaims=100, requests={"PUT leases": 500, "POST pods": 100},
                     flows={"exempt": 4000})
    console = Console(width=150, record=True)
    console.print(requests_table([ours, theirs], ["fakefleet", "kwok"]))
    lines = [" ".join(line.replace("│", " ").split())
             for line in console.export_text().splitlines()]
    assert "all requests 840 (8.4) 600 (6.0)" in lines
    assert "system-node-high 1191 (11.9) 0 (0.0)" in lines
    requests = [line.split(" (", 1)[0] for line in lines if "leases" in line or "pods" in line]
    assert requests == ["PATCH leases 740", "PUT leases 0", "POST pods 100"], "most first"


def test_stamps_keep_a_note_and_follow_a_property_through_every_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = iter(float(second) for second in range(100, 200))
    monkeypatch.setattr("bench.karpenter.time.time", lambda: next(now))
    stamps = Stamps(None, "/api/v1/nodes", {"ready": condition("Ready")},  # type: ignore[arg-type]
                    notes={"provider": lambda obj: obj["spec"].get("providerID") or None},
                    held={"ready": condition("Ready")})
    stamps._relisted([node("a", "", ready=False)])                  # 100: no note yet
    stamps._event("MODIFIED", node("a", "kwok://a", ready=True))    # 101
    stamps._event("MODIFIED", node("a", "kwok://b", ready=True))    # 102: the first note stays
    stamps._event("MODIFIED", node("a", "kwok://b", ready=False))   # 103
    stamps._event("MODIFIED", node("a", "kwok://b", ready=True))    # 104
    assert stamps.notes == {"provider": {"a": "kwok://a"}}
    assert stamps.histories["ready"]["a"] == [(100.0, False), (101.0, True), (103.0, False),
                                              (104.0, True)]
    assert stamps.stamps["a"]["ready"] == 101.0, "the mark is the first time only"


def test_the_last_pods_table_shows_each_pod_beside_its_node() -> None:
    run = SideRun("fakefleet", 1, last_pods=[
        {"pod": "gpu-7", "node": "gpu-abcde", "created": 0.1, "Unschedulable": 1.2,
         "node created": 300.0, "node registered": 301.0, "node Ready": 302.5,
         "node usable": 303.0, "bound": 598.25, "Running": 599.0},
        {"pod": "gpu-8", "node": "", "created": 0.2, "Unschedulable": 1.3, "node created": None,
         "node registered": None, "node Ready": None, "node usable": None, "bound": None,
         "Running": None}])
    console = Console(width=200, record=True)
    console.print(last_pods_table(run))
    lines = [" ".join(line.replace("│", " ").split())
             for line in console.export_text().splitlines()]
    assert "gpu-7 gpu-abcde 0.1 1.2 300 301 302.5 303 598.25 599" in lines
    assert "gpu-8 0.2 1.3 - - - - - -" in lines


def test_scale_up_ends_when_every_pod_still_there_runs_a_deleted_one_counted_apart() -> None:
    def pod(name: str, phase: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"phase": phase}}

    pods = Stamps(None, "/api/v1/pods",  # type: ignore[arg-type]
                  {"running": lambda obj: obj["status"]["phase"] == "Running"})
    pods._relisted([])
    assert not settled(pods, 3), "no pod yet"
    pods._event("ADDED", pod("gpu-0", "Running"))
    pods._event("ADDED", pod("gpu-1", "Pending"))
    assert not settled(pods, 3), "one pod not created yet"
    pods._event("ADDED", pod("gpu-2", "Running"))
    assert not settled(pods, 3), "gpu-1 Pending"
    pods._event("DELETED", pod("gpu-1", "Pending"))  # evicted, never made again
    assert settled(pods, 3)
    assert len(pods.stamps) - len(pods.live) == 1
