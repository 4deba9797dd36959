"""Usage amounts and profiles: the grammar the API server and the engine share, and the exact
values and integrals the CPU counters are made of. Pure."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from operators.api import usage
from operators.api.nodepools import FakeNodePoolSpec
from operators.api.usage import Profile

AMOUNTS = st.floats(min_value=0, max_value=64, allow_nan=False, allow_infinity=False)
TIMES = st.floats(min_value=0, max_value=86400, allow_nan=False, allow_infinity=False)
PERIODS = st.floats(min_value=0.001, max_value=3600, allow_nan=False, allow_infinity=False)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    shape = draw(st.sampled_from(["constant", "ramp", "sine"]))
    start, end = draw(AMOUNTS), draw(AMOUNTS)
    if shape == "constant":
        return Profile.constant(start)
    duration = draw(PERIODS) if shape == "sine" else draw(st.one_of(st.just(0.0), PERIODS))
    return Profile(shape, start, end, duration)


@pytest.mark.parametrize(("text", "kind", "expected"), [
    ("250m", "cpu", Profile.constant(0.25)),
    ("2", "cpu", Profile.constant(2.0)),
    ("1Gi", "memory", Profile.constant(2.0 ** 30)),
    ("1.5e3", "memory", Profile.constant(1500.0)),
    ("85", "percent", Profile.constant(85.0)),
    ("100", "percent", Profile.constant(100.0)),
    ("ramp(100m, 2, 5m)", "cpu", Profile("ramp", 0.1, 2.0, 300.0)),
    ("ramp(2,100m,0s)", "cpu", Profile("ramp", 2.0, 0.1, 0.0)),
    ("sine( 256Mi , 1Gi , 1m30s )", "memory", Profile("sine", 2.0 ** 28, 2.0 ** 30, 90.0)),
    ("sine(40, 95, 500ms)", "percent", Profile("sine", 40.0, 95.0, 0.5)),
])
def test_amounts_and_profiles_parse(text: str, kind: usage.Kind, expected: Profile) -> None:
    assert usage.parse(text, kind) == expected


@pytest.mark.parametrize(("text", "kind"), [
    ("-1", "cpu"), ("1 core", "cpu"), ("ramp(1, 2)", "cpu"), ("ramp(1, 2, 5)", "cpu"),
    ("sine(1, 2, 0s)", "cpu"), ("sine(1, 2, 0m0s)", "cpu"), ("square(1, 2, 1m)", "cpu"),
    ("101", "percent"), ("50%", "percent"), ("1Gi", "percent"), ("", "memory"),
    ("ramp(1, 2, 1m" + ")" * 200, "cpu"),
])
def test_what_is_not_an_amount_or_profile_is_refused_saying_what_is(text: str,
                                                                    kind: usage.Kind) -> None:
    with pytest.raises(ValueError, match="ramp\\(FROM, TO, DURATION\\) or sine"):
        usage.parse(text, kind)


@given(st.sampled_from(["cpu", "memory", "percent"]), st.text(max_size=40))
def test_the_schema_pattern_and_the_parser_accept_the_same_texts(kind: usage.Kind,
                                                                 text: str) -> None:
    """The API server checks a pool's defaults with the pattern, the engine annotations with
    the parser: either both accept a text or both refuse it."""
    matches = re.fullmatch(usage.pattern(kind), text) is not None
    try:
        usage.parse(text, kind)
        parsed = True
    except ValueError:
        parsed = False
    assert matches == parsed or (text != text.strip() and not matches)


def test_pool_defaults_are_valid_profiles_and_the_schema_refuses_others() -> None:
    spec = FakeNodePoolSpec.model_validate({"clusterRef": "c"})
    for text, kind in ((spec.usage.node.cpu, "cpu"), (spec.usage.pod.memory, "memory"),
                       (spec.usage.gpu.utilization, "percent")):
        usage.parse(text, kind)  # type: ignore[arg-type]
    rules = FakeNodePoolSpec.model_json_schema()["$defs"]["PodUsage"]["properties"]["cpu"]
    (rule,) = rules["x-kubernetes-validations"]
    assert "usage.pod.cpu must be CPU in cores" in rule["message"]


@given(profiles(), TIMES)
def test_a_profile_never_goes_below_zero(profile: Profile, t: float) -> None:
    assert profile.at(t) >= 0


@given(profiles(), TIMES, TIMES)
def test_the_integral_is_a_counter_that_never_runs_backwards(profile: Profile, a: float,
                                                           b: float) -> None:
    early, late = sorted((a, b))
    assert profile.integral(0, late) >= profile.integral(0, early) - 1e-9 * max(1.0, late)


@given(profiles(), TIMES, TIMES, TIMES)
def test_integrals_add_up(profile: Profile, a: float, b: float, c: float) -> None:
    t0, t1, t2 = sorted((a, b, c))
    whole = profile.integral(t0, t2)
    assert profile.integral(t0, t1) + profile.integral(t1, t2) == pytest.approx(
        whole, rel=1e-9, abs=1e-6)


@settings(max_examples=300)
@given(profiles(), st.floats(min_value=0.01, max_value=10_000))
def test_the_integral_is_exact_the_mean_rate_over_a_short_window_is_the_value(
        profile: Profile, t: float) -> None:
    """The rate metrics-server computes from two samples of the counter is the profile."""
    h = min(1e-4, profile.duration / 1000) if profile.shape == "sine" else 1e-4
    if profile.shape == "ramp" and abs(t - profile.duration) < 2 * h:
        t += 4 * h  # the ramp's corner: left and right values differ
    rate = (profile.integral(0, t + h) - profile.integral(0, t - h)) / (2 * h)
    assert rate == pytest.approx(profile.at(t), rel=1e-4, abs=1e-3)


def test_closed_forms() -> None:
    assert Profile.constant(0.25).integral(0, 60) == pytest.approx(15.0)
    ramp = Profile("ramp", 0.0, 2.0, 100.0)
    assert ramp.integral(0, 100) == pytest.approx(100.0)
    assert ramp.integral(0, 150) == pytest.approx(200.0)
    assert ramp.at(50) == pytest.approx(1.0)
    sine = Profile("sine", 1.0, 3.0, 600.0)
    assert sine.at(0) == 1.0
    assert sine.at(300) == pytest.approx(3.0)
    assert sine.integral(0, 600) == pytest.approx(2.0 * 600)
    assert sine.integral(0, 1200) == pytest.approx(2.0 * 1200)
    assert Profile.constant(5.0).integral(-10, 10) == pytest.approx(50.0), \
        "nothing before the start"


@given(st.integers(min_value=0, max_value=10 ** 12))
def test_quantities_read_as_kubernetes_reads_them(value: int) -> None:
    assert usage.quantity(str(value)) == value
    assert usage.quantity(f"{value}m") == pytest.approx(value / 1000)
    assert usage.quantity(f"{value}Ki") == value * 1024
    assert math.isclose(usage.quantity("1.5Gi"), 1.5 * 2 ** 30)
