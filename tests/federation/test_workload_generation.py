"""The hub's workload generators and placement policies: seeded, pure, property-tested."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.hub.arrivals import (
    MAX_SECONDS,
    Arrivals,
    DistributionError,
    RunTime,
    arrival_times,
    run_times,
)
from federation.hub.placement import Job, PlacementError, place

seeds = st.integers(min_value=0, max_value=2**53)
counts = st.integers(min_value=0, max_value=300)
rates = st.floats(min_value=0.01, max_value=1000)


@given(seed=seeds, count=counts, rate=rates, kind=st.sampled_from(["rate", "poisson"]))
def test_arrivals_are_ordered_repeatable_and_stable_in_their_prefix(
        seed: int, count: int, rate: float, kind: str) -> None:
    arrivals = Arrivals(kind=kind, rate=rate)  # type: ignore[arg-type]
    times = arrival_times(arrivals, count, seed)
    assert len(times) == count
    assert times == sorted(times)
    assert all(t >= 0 for t in times)
    assert times == arrival_times(arrivals, count, seed)
    # More Jobs do not move the first ones.
    assert arrival_times(arrivals, count + 5, seed)[:count] == times


def test_a_rate_spaces_evenly_and_poisson_has_the_rate_on_average() -> None:
    assert arrival_times(Arrivals("rate", rate=4), 5, 0) == [0, 0.25, 0.5, 0.75, 1.0]
    times = arrival_times(Arrivals("poisson", rate=4), 20_001, 7)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    # Exponential gaps: their standard deviation equals their mean.
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.05)
    assert arrival_times(Arrivals("poisson", rate=4), 10, 8) != arrival_times(
        Arrivals("poisson", rate=4), 10, 7)


@given(seed=seeds, count=counts,
       low=st.floats(min_value=0, max_value=1e5), span=st.floats(min_value=0, max_value=1e5))
def test_uniform_run_times_stay_between_low_and_high(seed: int, count: int, low: float,
                                                     span: float) -> None:
    run_time = RunTime("uniform", low=low, high=low + span)
    drawn = run_times(run_time, count, seed)
    assert len(drawn) == count
    assert all(low <= value <= low + span for value in drawn)
    assert drawn == run_times(run_time, count, seed)


@given(seed=seeds, median=st.floats(min_value=0.1, max_value=1e4),
       sigma=st.floats(min_value=0, max_value=3), cap=st.floats(min_value=0, max_value=1e5))
@settings(max_examples=50)
def test_lognormal_run_times_are_positive_and_capped(seed: int, median: float, sigma: float,
                                                     cap: float) -> None:
    drawn = run_times(RunTime("lognormal", seconds=median, sigma=sigma, cap=cap), 200, seed)
    assert all(0 <= value <= cap for value in drawn)


def test_lognormal_draws_stay_within_the_longest_run_time_without_a_cap() -> None:
    drawn = run_times(RunTime("lognormal", seconds=MAX_SECONDS, sigma=5), 1000, 0)
    assert max(drawn) == MAX_SECONDS


def test_the_bounds_say_what_is_accepted() -> None:
    with pytest.raises(DistributionError) as raised:
        arrival_times(Arrivals("rate", rate=0.001), 10_000, 0)
    assert "last of 10000 Jobs" in str(raised.value)
    assert "raise the rate to 0.00386 or more, or give fewer Jobs" in str(raised.value)
    with pytest.raises(DistributionError, match="give seconds from 0 to 2592000 "):
        run_times(RunTime("fixed", seconds=1e300), 1, 0)


def test_lognormal_run_times_have_the_median_asked_for() -> None:
    drawn = run_times(RunTime("lognormal", seconds=600, sigma=0.5), 20_001, 3)
    assert statistics.median(drawn) == pytest.approx(600, rel=0.03)
    assert run_times(RunTime("fixed", seconds=30), 3, 1) == [30, 30, 30]


@pytest.mark.parametrize(("distribution", "field"), [
    (lambda: arrival_times(Arrivals("rate", rate=0), 3, 0), "arrivals.rate"),
    (lambda: arrival_times(Arrivals("poisson", rate=float("nan")), 3, 0), "arrivals.rate"),
    (lambda: arrival_times(Arrivals("times", times=(1.0,)), 3, 0), "arrivals.times"),
    (lambda: arrival_times(Arrivals("times", times=(-1.0,)), 1, 0), r"arrivals.times\[0\]"),
    (lambda: run_times(RunTime("uniform", low=5, high=1), 3, 0), "runTime.low"),
    (lambda: run_times(RunTime("lognormal", seconds=0), 3, 0), "runTime.seconds"),
    (lambda: run_times(RunTime("lognormal", seconds=1, sigma=9), 3, 0), "runTime.sigma"),
    (lambda: run_times(RunTime("fixed", seconds=-1), 3, 0), "runTime.seconds"),
    # Past what the hub's arithmetic and protobuf's Duration and Timestamp hold.
    (lambda: run_times(RunTime("fixed", seconds=1e300), 3, 0), "runTime.seconds"),
    (lambda: run_times(RunTime("fixed", seconds=float("inf")), 3, 0), "runTime.seconds"),
    (lambda: run_times(RunTime("uniform", low=1, high=float("nan")), 3, 0), "runTime.high"),
    (lambda: run_times(RunTime("lognormal", seconds=1e9, sigma=1), 3, 0), "runTime.seconds"),
    (lambda: run_times(RunTime("fixed", seconds=1, cap=float("nan")), 3, 0), "runTime.cap"),
    (lambda: arrival_times(Arrivals("times", times=(0.0, 1e300)), 2, 0), r"arrivals.times\[1\]"),
    (lambda: arrival_times(Arrivals("times", times=(float("nan"),)), 1, 0),
     r"arrivals.times\[0\]"),
    (lambda: arrival_times(Arrivals("rate", rate=1e-300), 3, 0), "arrivals.rate"),
    (lambda: arrival_times(Arrivals("rate", rate=float("inf")), 3, 0), "arrivals.rate"),
    (lambda: arrival_times(Arrivals("poisson", rate=1e6), 3, 0), "arrivals.rate"),
    # One a day is a rate, but 100000 of them take 270 years to arrive.
    (lambda: arrival_times(Arrivals("rate", rate=1 / 86400), 100_000, 0), "arrivals.rate"),
])
def test_a_bad_distribution_is_refused_naming_its_field(distribution, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DistributionError, match=f"^{field}:"):
        distribution()


# -- placement -----------------------------------------------------------------------------

jobs_strategy = st.lists(st.builds(Job, pods=st.integers(1, 8), gpus_per_pod=st.integers(0, 8)),
                         max_size=60)
fleets = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.integers(0, 400),
                         min_size=1)


@given(jobs=jobs_strategy, free=fleets, seed=seeds,
       policy=st.sampled_from(["spread", "binpack", "weighted"]))
def test_no_policy_overfills_a_cluster_or_splits_a_gang(jobs: list[Job], free: dict[str, int],
                                                         seed: int, policy: str) -> None:
    placed = place(jobs, free, policy, seed=seed)  # type: ignore[arg-type]
    assert len(placed) == len(jobs)
    used = Counter[str]()
    for job, cluster in zip(jobs, placed, strict=True):
        if cluster is not None:
            used[cluster] += job.gpus
    assert all(used[name] <= free[name] for name in used)
    remaining = {name: free[name] - used[name] for name in free}
    for job, cluster in zip(jobs, placed, strict=True):
        if cluster is None:  # it did not fit when its turn came, and fits no better now
            assert job.gpus > 0
    assert placed == place(jobs, free, policy, seed=seed)  # type: ignore[arg-type]
    assert all(value >= 0 for value in remaining.values())


def test_spread_takes_turns_and_binpack_fills_one_cluster_first() -> None:
    jobs = [Job(pods=1, gpus_per_pod=8)] * 6
    free = {"a": 64, "b": 64, "c": 64}
    assert place(jobs, free, "spread") == ["a", "b", "c", "a", "b", "c"]
    assert place(jobs, {"a": 64, "b": 16, "c": 64}, "binpack") == ["b", "b", "a", "a", "a",
                                                                  "a"]
    # A gang of 64 GPUs fits only a whole cluster; binpack kept one free for it.
    big = [*[Job(pods=1, gpus_per_pod=8)] * 8, Job(pods=8, gpus_per_pod=8)]
    assert place(big, {"a": 64, "b": 64}, "binpack")[-1] == "b"
    assert place(big, {"a": 64, "b": 64}, "spread")[-1] is None


def test_weighted_follows_the_weights_and_named_only_the_names() -> None:
    jobs = [Job(pods=1, gpus_per_pod=0)] * 3000
    placed = Counter(place(jobs, {"a": 0, "b": 0, "c": 0}, "weighted", seed=5,
                           weights={"a": 3, "b": 1, "c": 0}))
    assert placed["c"] == 0
    assert placed["a"] / placed["b"] == pytest.approx(3, rel=0.1)
    assert set(place(jobs[:10], {"a": 8, "b": 8, "c": 8}, "named", names=["c", "a"])) == {
        "c", "a"}
    with pytest.raises(PlacementError, match=r"^target.clusters: x"):
        place(jobs, {"a": 8}, "named", names=["x"])
    with pytest.raises(PlacementError, match=r"^target.weights"):
        place(jobs, {"a": 8}, "weighted", weights={"a": -1})
