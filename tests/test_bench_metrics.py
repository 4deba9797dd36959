"""Reading the API server's counters: mutating requests, 429s and APF's queue waits."""
# ruff: noqa: E501  (metric lines as the API server writes them)

from bench.metrics import (
    all_requests,
    dispatched_requests,
    grown,
    mutating_requests,
    queue_waits,
    throttled_requests,
)

METRICS = """\
# HELP apiserver_request_total Counter of apiserver requests
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PATCH",version="v1"} 120
apiserver_request_total{code="429",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PATCH",version="v1"} 7
apiserver_request_total{code="429",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 9
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="true",flow_schema="system-node-high",priority_level="node-high"} 1.5
apiserver_flowcontrol_request_wait_duration_seconds_count{execute="true",flow_schema="system-node-high",priority_level="node-high"} 100
apiserver_flowcontrol_request_wait_duration_seconds_sum{execute="false",flow_schema="system-node-high",priority_level="node-high"} 0.5
apiserver_flowcontrol_request_wait_duration_seconds_count{execute="false",flow_schema="system-node-high",priority_level="node-high"} 7
apiserver_flowcontrol_request_wait_duration_seconds_bucket{execute="true",flow_schema="system-node-high",priority_level="node-high",le="0.1"} 90
"""


def test_mutating_requests_count_every_answer() -> None:
    assert mutating_requests(METRICS) == {"PATCH leases": 127, "PATCH pods/status": 2}


def test_throttled_requests_are_the_429s_by_request() -> None:
    assert throttled_requests(METRICS) == {"PATCH leases": 7, "PATCH pods/status": 2}


def test_queue_waits_sum_both_outcomes_per_level() -> None:
    assert queue_waits(METRICS) == {"node-high": (2.0, 107)}


def test_all_requests_count_reads_and_watches_too() -> None:
    assert all_requests(METRICS) == {"PATCH leases": 127, "PATCH pods/status": 2,
                                     "LIST pods": 9}


def test_dispatched_requests_are_by_flow_schema_and_grown_keeps_the_gains() -> None:
    text = ('apiserver_flowcontrol_dispatched_requests_total{flow_schema="system-nodes",'
            'priority_level="system"} 40\n'
            'apiserver_flowcontrol_dispatched_requests_total{flow_schema="system-node-high",'
            'priority_level="node-high"} 300\n'
            'apiserver_flowcontrol_dispatched_requests_total{flow_schema="exempt",'
            'priority_level="exempt"} 12\n')
    before = {"system-nodes": 40, "system-node-high": 100, "exempt": 2}
    assert grown(before, dispatched_requests(text)) == {"system-node-high": 200, "exempt": 10}
