"""bench.tails: a Karpenter scale-up's tail taken apart from the watches' moments, and
kube-scheduler's account read from its metrics (series as v1.36 writes them)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from bench.engines import node_ready
from bench.tails import (
    gauges_after,
    initialized,
    last_pods,
    losses,
    onset,
    quantile,
    registered,
    relist_figures,
    relists,
    scheduler_counters,
    scheduler_gauges,
    spread,
    tail_figures,
    untolerated,
    usable,
)


def node(taints: list[tuple[str, str]], ready: bool = True,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n", "labels": labels or {}},
            "spec": {"taints": [{"key": key, "effect": effect} for key, effect in taints]},
            "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_a_node_is_usable_once_ready_with_only_the_gpu_taint_left() -> None:
    fresh = node([("karpenter.sh/unregistered", "NoExecute"),
                  ("node.kubernetes.io/not-ready", "NoSchedule"),
                  ("nvidia.com/gpu", "NoSchedule")], ready=False)
    assert untolerated(fresh) == ["karpenter.sh/unregistered", "node.kubernetes.io/not-ready"]
    assert not registered(fresh)
    assert not usable(node_ready)(fresh)
    registered_not_lifted = node([("node.kubernetes.io/not-ready", "NoSchedule"),
                                  ("nvidia.com/gpu", "NoSchedule")])
    assert registered(registered_not_lifted)
    assert not usable(node_ready)(registered_not_lifted), "Ready, the not-ready taint still on"
    done = node([("nvidia.com/gpu", "NoSchedule"), ("spot", "PreferNoSchedule")],
                labels={"karpenter.sh/initialized": "true"})
    assert usable(node_ready)(done), "a PreferNoSchedule taint only scores"
    assert initialized(done)
    assert not usable(node_ready)(node([("nvidia.com/gpu", "NoExecute")])), \
        "the pods tolerate the GPU taint's NoSchedule only"
    assert not usable(node_ready)(node([], ready=False))


def test_quantiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert quantile(values, 0.5) == 50.0
    assert quantile(values, 0.99) == 99.0
    assert quantile(values, 1.0) == 100.0
    assert quantile([3.0], 0.5) == 3.0
    assert quantile([], 0.5) is None
    assert spread("x", [2.0, 1.0, 300.0]) == {"x p50": 2.0, "x p99": 300.0, "x max": 300.0,
                                              "x (count)": 3}
    assert spread("x", []) == {"x p50": None, "x p99": None, "x max": None, "x (count)": 0}


def test_the_onset_is_the_start_of_the_stretch_holding_at_a_moment() -> None:
    history = [(10.0, False), (20.0, True), (50.0, False), (60.0, True)]
    assert onset(history, 15.0) is None
    assert onset(history, 20.0) == 20.0
    assert onset(history, 49.0) == 20.0
    assert onset(history, 55.0) is None, "not usable then"
    assert onset(history, 100.0) == 60.0, "usable again: the last stretch counts"
    assert onset([(5.0, True), (8.0, True)], 9.0) == 5.0
    assert onset([], 1.0) is None
    assert losses(history) == 1
    assert losses([(1.0, False), (2.0, True)]) == 0


def pods_and_nodes() -> tuple[dict[str, dict[str, float]], dict[str, str],
                              dict[str, dict[str, float]], dict[str, list[tuple[float, bool]]],
                              dict[str, list[tuple[float, bool]]]]:
    """Two pods on two nodes from t=1000: gpu-0's node usable at 1040 and gpu-0 bound at
    1041; gpu-1's node usable at 1100 and gpu-1 bound only at 1400 (the flush's wait), Running
    2 s later."""
    pods = {
        "gpu-0": {"seen": 1000.0, "unschedulable": 1001.0, "bound": 1041.0, "running": 1042.0},
        "gpu-1": {"seen": 1000.5, "unschedulable": 1001.5, "bound": 1400.0, "running": 1402.0},
    }
    placed = {"gpu-0": "a", "gpu-1": "b"}
    nodes = {
        "a": {"seen": 1030.0, "registered": 1032.0, "ready": 1035.0, "usable": 1040.0,
              "initialized": 1045.0},
        "b": {"seen": 1060.0, "registered": 1090.0, "ready": 1065.0, "usable": 1100.0,
              "initialized": 1110.0},
    }
    usable_histories = {"a": [(1030.0, False), (1040.0, True)],
                        "b": [(1060.0, False), (1100.0, True)]}
    ready_histories = {"a": [(1030.0, False), (1035.0, True)],
                       "b": [(1060.0, False), (1065.0, True)]}
    return pods, placed, nodes, usable_histories, ready_histories


def test_the_tail_says_which_step_each_pod_waited_on() -> None:
    pods, placed, nodes, usable_histories, ready_histories = pods_and_nodes()
    figures = tail_figures(pods, placed, nodes, usable_histories, ready_histories,
                           started=1000.0)
    assert figures["node usable → a pod bound to it (kube-scheduler) p50"] == 1.0
    assert figures["node usable → a pod bound to it (kube-scheduler) max"] == 300.0
    assert figures["pods bound > 30 s after their node was usable"] == 1
    assert figures["pods bound to a node not (yet) seen usable"] == 0
    assert figures["pod bound → Running (node player) max"] == 2.0
    assert figures["pod created → bound max"] == 399.5
    assert figures["node created → unregistered taint gone (Karpenter) max"] == 30.0
    assert figures["node created → Ready (node player) p50"] == 5.0
    assert figures["node Ready → usable (taints lifted) max"] == 35.0
    assert figures["node Ready → initialized label (Karpenter) p50"] == 10.0
    assert figures["last node usable"] == 100.0
    assert figures["last node Ready"] == 65.0
    assert figures["last pod bound"] == 400.0
    assert figures["last pod Running"] == 402.0
    assert figures["last pod bound: its node usable → bound"] == 300.0
    assert figures["last pod bound: first Unschedulable → bound"] == 398.5
    assert figures["nodes that stopped being usable after they were"] == 0


def test_a_node_usable_again_counts_from_its_last_onset_and_as_a_loss() -> None:
    pods, placed, nodes, usable_histories, ready_histories = pods_and_nodes()
    usable_histories["b"] = [(1060.0, False), (1100.0, True), (1200.0, False), (1390.0, True)]
    ready_histories["b"] += [(1200.0, False), (1380.0, True)]
    figures = tail_figures(pods, placed, nodes, usable_histories, ready_histories,
                           started=1000.0)
    assert figures["last pod bound: its node usable → bound"] == 10.0
    assert figures["pods bound > 30 s after their node was usable"] == 0
    assert figures["nodes that stopped being usable after they were"] == 1
    assert figures["nodes that lost Ready after they had it"] == 1


def test_a_pod_bound_before_its_node_was_seen_usable_is_counted_apart() -> None:
    pods, placed, nodes, usable_histories, ready_histories = pods_and_nodes()
    pods["gpu-0"]["bound"] = 1039.0  # the pods' watch ahead of the nodes'
    figures = tail_figures(pods, placed, nodes, usable_histories, ready_histories,
                           started=1000.0)
    assert figures["pods bound to a node not (yet) seen usable"] == 1
    assert figures["node usable → a pod bound to it (kube-scheduler) (count)"] == 1


def test_the_last_pods_come_with_their_nodes_moments() -> None:
    pods, placed, nodes, usable_histories, _ = pods_and_nodes()
    pods["gpu-2"] = {"seen": 1000.7, "unschedulable": 1002.0}  # never placed
    rows = last_pods(pods, placed, nodes, usable_histories, started=1000.0, count=2)
    assert [row["pod"] for row in rows] == ["gpu-2", "gpu-1"], "never Running comes first"
    assert rows[0]["node"] == ""
    assert rows[0]["bound"] is None
    assert rows[1] == {"pod": "gpu-1", "node": "b", "created": 0.5, "Unschedulable": 1.5,
                       "node created": 60.0, "node registered": 90.0, "node Ready": 65.0,
                       "node usable": 100.0, "bound": 400.0, "Running": 402.0}


SCHEDULER = """\
# HELP scheduler_queue_incoming_pods_total [STABLE] Number of pods added to scheduling queues.
# TYPE scheduler_queue_incoming_pods_total counter
scheduler_queue_incoming_pods_total{event="PodAdd",queue="active"} 1000
scheduler_queue_incoming_pods_total{event="ScheduleAttemptFailure",queue="unschedulable"} 2400
scheduler_queue_incoming_pods_total{event="NodeTaintChange",queue="backoff"} 1300
scheduler_queue_incoming_pods_total{event="UnschedulableTimeout",queue="active"} 180
scheduler_queue_incoming_pods_total{event="UnschedulableTimeout",queue="backoff"} 20
# HELP scheduler_schedule_attempts_total [STABLE] Number of attempts to schedule pods.
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="error"} 0
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 1000
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 2400
# HELP scheduler_pod_scheduled_after_flush_total [ALPHA] Pods scheduled after a flush.
# TYPE scheduler_pod_scheduled_after_flush_total counter
scheduler_pod_scheduled_after_flush_total 200
# HELP scheduler_queueing_hint_execution_duration_seconds [ALPHA] Duration of a hint.
# TYPE scheduler_queueing_hint_execution_duration_seconds histogram
scheduler_queueing_hint_execution_duration_seconds_bucket{event="NodeTaintChange",hint="Queue",\
plugin="TaintToleration",le="+Inf"} 1300
scheduler_queueing_hint_execution_duration_seconds_sum{event="NodeTaintChange",hint="Queue",\
plugin="TaintToleration"} 0.01
scheduler_queueing_hint_execution_duration_seconds_count{event="NodeTaintChange",hint="Queue",\
plugin="TaintToleration"} 1300
scheduler_queueing_hint_execution_duration_seconds_count{event="NodeAdd",hint="QueueSkip",\
plugin="NodeResourcesFit"} 5000
# HELP scheduler_pending_pods [STABLE] Number of pending pods, by the queue type.
# TYPE scheduler_pending_pods gauge
scheduler_pending_pods{queue="active"} 0
scheduler_pending_pods{queue="backoff"} 3
scheduler_pending_pods{queue="unschedulable"} 200
# HELP scheduler_unschedulable_pods [BETA] The number of unschedulable pods by plugin.
# TYPE scheduler_unschedulable_pods gauge
scheduler_unschedulable_pods{plugin="NodeResourcesFit",profile="default-scheduler"} 200
scheduler_unschedulable_pods{plugin="TaintToleration",profile="default-scheduler"} 0
"""


def test_scheduler_counters_say_which_event_moved_the_pods() -> None:
    counts = scheduler_counters(SCHEDULER)
    assert counts["pods into active on UnschedulableTimeout"] == 180
    assert counts["pods into backoff on UnschedulableTimeout"] == 20
    assert counts["pods into backoff on NodeTaintChange"] == 1300
    assert counts["attempts scheduled"] == 1000
    assert counts["attempts unschedulable"] == 2400
    assert counts["attempts error"] == 0
    assert counts["scheduled after the flush"] == 200
    assert counts["hint TaintToleration on NodeTaintChange: Queue"] == 1300, "the count only"
    assert counts["hint NodeResourcesFit on NodeAdd: QueueSkip"] == 5000
    assert not any("pending" in key for key in counts), "gauges are read apart"


def test_scheduler_gauges_say_where_the_pods_wait() -> None:
    assert scheduler_gauges(SCHEDULER) == {
        "pending active": 0, "pending backoff": 3, "pending unschedulable": 200,
        "unschedulable by NodeResourcesFit": 200, "unschedulable by TaintToleration": 0}


def test_the_queues_shown_are_the_first_sample_once_every_node_was_usable() -> None:
    samples = [(10.0, {"pending unschedulable": 900.0}), (20.0, {"pending unschedulable": 5.0}),
               (30.0, {"pending unschedulable": 0.0})]
    assert gauges_after(samples, 15.0) == (20.0, {"pending unschedulable": 5.0})
    assert gauges_after(samples, 20.0) == (20.0, {"pending unschedulable": 5.0})
    assert gauges_after(samples, 31.0) is None
    assert gauges_after(samples, None) is None


@pytest.mark.parametrize("text", ["", "# TYPE scheduler_pending_pods gauge\n"])
def test_no_series_no_figures(text: str) -> None:
    assert scheduler_counters(text) == {}
    assert scheduler_gauges(text) == {}


def test_the_engine_s_pod_watch_relists_are_read_from_its_log() -> None:
    log = "\n".join([
        "2026-12-03 22:00:00,000 INFO operators.engine.running: engine default/bench: ready",
        "2026-12-03 22:04:10,500 INFO operators.k8s.watching: watch /api/v1/pods: "
        "resourceVersion 123 is gone; relisting",
        "2026-12-03 22:04:11,000 INFO operators.k8s.watching: watch /api/v1/nodes: "
        "resourceVersion 124 is gone; relisting",
        "2026-12-03 22:09:20,250 INFO operators.k8s.watching: watch /api/v1/pods: "
        "resourceVersion 999 is gone; relisting",
    ])
    start = datetime.datetime(2026, 12, 3, 22, 0, 0).timestamp()
    assert relists(log, "/api/v1/pods") == [start + 250.5, start + 560.25]
    assert relist_figures(log, "/api/v1/pods", started=start + 300.0) == {
        "engine's watch of /api/v1/pods listed again": 1,
        "engine's watch of /api/v1/pods listed again, last": 260.25}
    assert relist_figures("", "/api/v1/pods", started=start) == {
        "engine's watch of /api/v1/pods listed again": 0,
        "engine's watch of /api/v1/pods listed again, last": None}
