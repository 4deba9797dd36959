"""When a workload's Jobs arrive and how long each runs: seeded, pure, no clock.

Arrivals are seconds after the workload's start: ``rate`` (evenly spaced, one every 1/rate s),
``poisson`` (exponential gaps with mean 1/rate) or ``times`` (given). Run times are seconds:
``fixed``, ``uniform`` between a low and a high, or ``lognormal`` around a median with a shape
``sigma``, optionally capped. The same seed gives the same numbers on every machine (Python's
Mersenne Twister, seeded from a string that names what is drawn, so arrivals and run times do
not share a stream and adding Jobs does not change the first ones).

Every number is bounded to what the hub's arithmetic and the wire hold: a run time, a cap and an
arrival are at most :data:`MAX_SECONDS` (protobuf's Duration and Timestamp hold far more, but a
Job that runs longer, or arrives later, than a month is a mistake), the last of a workload's
arrivals too, and a rate is from :data:`MIN_RATE` to :data:`MAX_RATE`. Lognormal draws, whose
tail is unbounded, are capped at :data:`MAX_SECONDS` whatever the cap.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Literal

#: Longest run time, latest arrival (30 days, in seconds).
MAX_SECONDS = 30 * 86400.0
#: Jobs per second: one a day at least, and no more than the hub dispatches.
MIN_RATE = 1 / 86400
MAX_RATE = 1000.0
_SECONDS = f"seconds from 0 to {MAX_SECONDS:.0f} (30 days)"


class DistributionError(ValueError):
    """A distribution that cannot be drawn from; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Arrivals:
    kind: Literal["rate", "poisson", "times"]
    rate: float = 0.0
    """Jobs per second (rate, poisson)."""
    times: tuple[float, ...] = ()
    """Seconds after the start (times); as many as there are Jobs."""

    def check(self, count: int) -> None:
        if self.kind in ("rate", "poisson"):
            if not MIN_RATE <= self.rate <= MAX_RATE:  # NaN compares false: refused too
                raise DistributionError(
                    f"arrivals.rate: {self.rate!r}; give Jobs per second from {MIN_RATE:.3g} "
                    f"(one a day) to {MAX_RATE:g} (e.g. 2.5)")
            last = (count - 1) / self.rate
            if last > MAX_SECONDS:
                raise DistributionError(
                    f"arrivals.rate: {self.rate!r} Jobs/s brings the last of {count} Jobs "
                    f"{last:.3g}s after the start; arrivals end within {MAX_SECONDS:.0f}s "
                    f"(30 days): raise the rate to {(count - 1) / MAX_SECONDS:.3g} or more, "
                    f"or give fewer Jobs")
        if self.kind == "times":
            if len(self.times) != count:
                raise DistributionError(f"arrivals.times: {len(self.times)} times for {count} "
                                        f"Jobs; give one time per Job")
            for index, value in enumerate(self.times):
                if not 0 <= value <= MAX_SECONDS:
                    raise DistributionError(f"arrivals.times[{index}]: {value!r}; give "
                                            f"{_SECONDS} after the start")


@dataclasses.dataclass(frozen=True)
class RunTime:
    kind: Literal["fixed", "uniform", "lognormal"]
    seconds: float = 0.0
    """fixed: the run time; lognormal: the median."""
    low: float = 0.0
    high: float = 0.0
    """uniform: between low and high."""
    sigma: float = 0.0
    """lognormal: the shape (0.5: most within a factor of about 2.7 of the median)."""
    cap: float | None = None
    """No run time above this (lognormal has a long tail)."""

    def check(self) -> None:
        def finite(value: float, field: str) -> None:
            if not 0 <= value <= MAX_SECONDS:  # NaN compares false: refused too
                raise DistributionError(f"runTime.{field}: {value!r}; give {_SECONDS}")
        if self.kind == "fixed":
            finite(self.seconds, "seconds")
        elif self.kind == "uniform":
            finite(self.low, "low")
            finite(self.high, "high")
            if self.low > self.high:
                raise DistributionError(f"runTime.low: {self.low:g} is above high "
                                        f"{self.high:g}; swap them")
        else:
            finite(self.seconds, "seconds")
            if self.seconds == 0:
                raise DistributionError("runTime.seconds: the median of a lognormal run time "
                                        "is more than 0")
            if not (0 <= self.sigma <= 5 and math.isfinite(self.sigma)):
                raise DistributionError(f"runTime.sigma: {self.sigma!r}; give a shape from 0 "
                                        f"to 5 (e.g. 0.5)")
        if self.cap is not None:
            finite(self.cap, "cap")


def _rng(seed: int, what: str) -> random.Random:
    return random.Random(f"{seed}/{what}")


def arrival_times(arrivals: Arrivals, count: int, seed: int) -> list[float]:
    """Seconds after the start at which each of ``count`` Jobs arrives, in order."""
    arrivals.check(count)
    if arrivals.kind == "times":
        return sorted(arrivals.times)
    if arrivals.kind == "rate":
        return [index / arrivals.rate for index in range(count)]
    rng = _rng(seed, "arrivals")
    now, times = 0.0, []
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(arrivals.rate)
    return times


def run_times(run_time: RunTime, count: int, seed: int) -> list[float]:
    """How long each of ``count`` Jobs runs, in seconds."""
    run_time.check()
    rng = _rng(seed, "run-times")
    drawn: Sequence[float]
    if run_time.kind == "fixed":
        drawn = [run_time.seconds] * count
    elif run_time.kind == "uniform":
        drawn = [rng.uniform(run_time.low, run_time.high) for _ in range(count)]
    else:
        mu = math.log(run_time.seconds)
        drawn = [rng.lognormvariate(mu, run_time.sigma) for _ in range(count)]
    cap = MAX_SECONDS if run_time.cap is None else min(run_time.cap, MAX_SECONDS)
    return [min(value, cap) for value in drawn]
