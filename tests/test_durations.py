"""Durations as users write them: what a number of seconds they stand for, and the bounds that
keep every date computed from them a date."""

from __future__ import annotations

import datetime

import pytest
from pydantic import ValidationError

from operators.api.durations import DURATION_LENGTH, parse_duration
from operators.api.nodepools import PodBehaviour


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("1m30s", 90.0), ("500ms", 0.5), ("2h", 7200.0), ("0s", 0.0),
    ("9999999h9999999h9999999h9999999h", 4 * 9999999 * 3600.0),
    ("2592000.000s", 2592000.0),
])
def test_durations_read_as_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [
    "9" * 400 + "s", "10000000h", "1e300s", "inf", "nan", "-1s", "", "1.5.5s", "1s" * 17,
])
def test_what_is_no_bounded_duration_is_refused_naming_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration such as 90s"):
        parse_duration(text)


def test_the_longest_duration_accepted_is_still_a_date_from_now() -> None:
    longest = parse_duration("9999999h9999999h9999999h9999999h")
    assert len("9999999h9999999h9999999h9999999h") == DURATION_LENGTH
    datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=longest)


@pytest.mark.parametrize("field", ["startDelay", "startJitter", "initDelay", "jobRunTime",
                                   "jobRunJitter", "terminationGracePeriodCap"])
def test_a_pool_refuses_a_duration_that_would_be_infinite(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        PodBehaviour.model_validate({field: "9" * 400 + "s"})
