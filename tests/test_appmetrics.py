"""Application metrics, pure: the annotations' names and values, their text as Prometheus
reads it, and what the usage book measures of them on a fake clock (from the container's
start, following annotation changes, a bad annotation reported once)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from operators.api import appmetrics
from operators.api.appmetrics import MAX_METRICS, MAX_NAME_LENGTH
from operators.api.nodepools import FakeNodePoolSpec
from operators.api.usage import Profile
from operators.engine import pods as podlife
from operators.engine.pods import PodFacts, PodLife
from operators.engine.usage import UsageBook
from operators.k8s.times import rfc3339
from operators.metrics.application import ApplicationSample, render

T0 = 1_800_000_000.0
WAITING = "fakefleet.dev/metric.vllm_num_requests_waiting"
SPEC = FakeNodePoolSpec.model_validate({"clusterRef": "c"})


# -- the annotations ------------------------------------------------------------------------------

def test_a_pod_s_metrics_are_its_metric_annotations_in_the_usage_syntax() -> None:
    declared = appmetrics.declared({
        WAITING: "30", "fakefleet.dev/metric.tokens": "ramp(0, 40, 5m)",
        "fakefleet.dev/usage-cpu": "1", "example.com/metric.other": "2"})
    assert [key for key, _ in declared] == ["fakefleet.dev/metric.tokens", WAITING]
    metrics, problems = appmetrics.parse(declared)
    assert metrics == (("tokens", Profile("ramp", 0.0, 40.0, 300.0)),
                       ("vllm_num_requests_waiting", Profile.constant(30.0)))
    assert problems == {}


@pytest.mark.parametrize("name", ["vllm_num_requests_waiting", "a", "_x1", "Queue_Len2",
                                  "x" * MAX_NAME_LENGTH])
def test_metric_names_follow_prometheus_within_the_annotation_key_rules(name: str) -> None:
    assert appmetrics.check_name(name) is None


@pytest.mark.parametrize("name", ["1st", "queue-length", "vllm.waiting", "queue_", "",
                                  "x" * (MAX_NAME_LENGTH + 1)])
def test_other_names_are_refused_with_what_a_name_is(name: str) -> None:
    problem = appmetrics.check_name(name)
    assert problem is not None
    assert "letters, digits and underscores" in problem
    assert "e.g. vllm_num_requests_waiting" in problem


def test_bad_values_and_names_are_problems_of_their_key_the_rest_is_served() -> None:
    metrics, problems = appmetrics.parse(appmetrics.declared({
        WAITING: "-3", "fakefleet.dev/metric.queue-length": "4",
        "fakefleet.dev/metric.running": "7"}))
    assert metrics == (("running", Profile.constant(7.0)),)
    assert "'-3' is not a number such as 30 or 2.5" in problems[WAITING]
    assert "ramp(0, 40, 5m)" in problems[WAITING], "the syntax, with an example"
    assert "'queue-length' is not a metric name" in problems["fakefleet.dev/metric.queue-length"]


def test_a_pod_serves_a_bounded_number_of_metrics() -> None:
    many = {f"fakefleet.dev/metric.m{i:03}": "1" for i in range(MAX_METRICS + 2)}
    metrics, problems = appmetrics.parse(appmetrics.declared(many))
    assert len(metrics) == MAX_METRICS
    assert sorted(problems) == ["fakefleet.dev/metric.m032", "fakefleet.dev/metric.m033"]
    assert f"at most {MAX_METRICS} metrics" in problems["fakefleet.dev/metric.m032"]


# -- the text ---------------------------------------------------------------------------------

def test_the_text_is_a_gauge_per_metric_labelled_as_prometheus_labels_a_pod() -> None:
    text = render(ApplicationSample("serving", "vllm-0", "engine",
                                    (("tokens", 12.5), ("vllm_num_requests_waiting", 30.0))))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {"tokens", "vllm_num_requests_waiting"}
    (sample,) = families["vllm_num_requests_waiting"].samples
    assert families["vllm_num_requests_waiting"].type == "gauge"
    assert sample.labels == {"namespace": "serving", "pod": "vllm-0", "container": "engine"}
    assert (sample.value, sample.timestamp) == (30.0, None), "Prometheus stamps the scrape"
    assert families["tokens"].samples[0].value == 12.5
    assert "vllm_num_requests_waiting{container=\"engine\",namespace=\"serving\"," \
           "pod=\"vllm-0\"} 30\n" in text
    assert render(ApplicationSample("serving", "vllm-0", "engine", ())) == ""


# -- the book -----------------------------------------------------------------------------------

def book() -> UsageBook:
    return UsageBook(pool_of=lambda node: ("cpu", SPEC), created=lambda node: rfc3339(T0))


def facts(name: str, **annotations: str) -> PodFacts:
    return PodFacts({"metadata": {"uid": f"uid-{name}", "namespace": "serving", "name": name,
                                  "annotations": annotations},
                     "spec": {"nodeName": "cpu-0", "containers": [
                         {"name": "engine", "image": "vllm"}, {"name": "proxy", "image": "p"}]}})


def running(at: float) -> PodLife:
    return PodLife(phase=podlife.RUNNING, started_at=rfc3339(at))


def test_the_book_measures_a_pod_s_metrics_from_its_container_s_start() -> None:
    usage = book()
    pod = facts("vllm-0", **{WAITING: "ramp(0, 40, 100s)"})
    assert usage.seen(pod, PodLife(phase=podlife.PENDING), T0) == ()
    assert usage.application_sample("cpu-0", "serving", "vllm-0", T0 + 5) is None, \
        "not started: nothing listens"
    usage.lived(pod.uid, running(T0 + 10), T0 + 10)
    sample = usage.application_sample("cpu-0", "serving", "vllm-0", T0 + 35)
    assert sample == ApplicationSample("serving", "vllm-0", "engine",
                                       (("vllm_num_requests_waiting", 10.0),))
    later = usage.application_sample("cpu-0", "serving", "vllm-0", T0 + 500)
    assert later is not None
    assert later.values == (("vllm_num_requests_waiting", 40.0),)
    assert usage.application_sample("cpu-1", "serving", "vllm-0", T0 + 35) is None, \
        "served at its own node only"
    assert usage.application_sample("cpu-0", "other", "vllm-0", T0 + 35) is None
    usage.gone(pod.uid, T0 + 600)
    assert usage.application_sample("cpu-0", "serving", "vllm-0", T0 + 601) is None


def test_an_annotation_change_takes_effect_at_once_and_a_bad_one_is_reported_once() -> None:
    usage = book()
    pod = facts("vllm-0", **{WAITING: "0"})
    usage.seen(pod, running(T0), T0)
    pod.recorded({"annotations": {WAITING: "30", "fakefleet.dev/usage-cpu": "1"}})
    assert usage.annotated(pod.uid, T0 + 60) == ()
    sample = usage.application_sample("cpu-0", "serving", "vllm-0", T0 + 61)
    assert sample is not None
    assert sample.values == (("vllm_num_requests_waiting", 30.0),)
    pod.recorded({"annotations": {WAITING: "many", "fakefleet.dev/usage-cpu": "1"}})
    (problem,) = usage.annotated(pod.uid, T0 + 70)
    assert problem.startswith(f"annotation {WAITING} ignored: 'many' is not a number")
    assert usage.annotated(pod.uid, T0 + 71) == (), "not again for the same text"
    pod.recorded({"annotations": {WAITING: "many", "fakefleet.dev/usage-cpu": "2"}})
    assert usage.annotated(pod.uid, T0 + 72) == (), "nor when another annotation changes"
    sample = usage.application_sample("cpu-0", "serving", "vllm-0", T0 + 73)
    assert sample is not None
    assert sample.values == (), "an ignored metric is not served"
