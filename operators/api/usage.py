"""Simulated resource usage as users write it: a constant or a small time profile, in pod
annotations and in a FakeNodePool's defaults. Pure: parsing, and the exact values and integrals
the engine serves as kubelet and DCGM metrics.

One syntax for every amount (CPU in cores, memory in bytes, GPU figures in percent, and the
plain numbers of application metrics, :mod:`operators.api.appmetrics`)::

    250m                      constant: a quarter of a core
    ramp(100m, 2, 5m)         from 100m at the container's start to 2 cores 5 minutes later,
                              then 2 cores from there on
    sine(100m, 500m, 10m)     100m at the start, 500m after 5 minutes, 100m again after 10:
                              a wave between the two values with a period of 10 minutes

Times count from the container's start. Both values of a profile are amounts of the same kind
(neither negative), so every profile accepted is a usage that never goes below zero, whichever
value is larger: ``ramp(2, 100m, 1m)`` falls, ``sine(500m, 100m, 10m)`` starts at its peak. A
ramp's duration may be 0 (a step); a sine's period may not.

The schema patterns here are the whole grammar: the API server checks a pool's defaults against
them, and the engine checks annotations against the same expressions (:func:`parse`), so what
one accepts the other does. CPU usage is a counter in the kubelet's metrics (core-seconds since
the container started): :meth:`Profile.integral` is exact, so a counter sampled at any two times
gives exactly the mean rate between them.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import re
from typing import Literal

from operators.api.durations import parse_duration

#: A non-negative Kubernetes quantity ("2", "250m", "1Gi", "1.5e3").
QUANTITY = (r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
            r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?")
#: A percentage from 0 to 100 ("85", "12.5", "100").
PERCENT = r"((100(\.0*)?)|([0-9]{1,2}(\.[0-9]*)?)|(\.[0-9]+))"
_PART = r"[0-9]+(\.[0-9]+)?(ms|s|m|h)"
#: A duration as :mod:`operators.api.durations` reads it ("90s", "1m30s", "500ms").
DURATION = rf"({_PART})+"
#: A duration that is not zero: one of its parts has a digit other than 0.
_NONZERO_PART = r"(0*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)(ms|s|m|h)"
PERIOD = rf"({_PART})*{_NONZERO_PART}({_PART})*"

Kind = Literal["cpu", "memory", "percent", "number"]
_VALUES: dict[str, str] = {"cpu": QUANTITY, "memory": QUANTITY, "percent": PERCENT,
                           "number": QUANTITY}
#: How each kind is spelled in messages, with an example.
_EXAMPLES: dict[str, str] = {
    "cpu": "CPU in cores such as 250m or 2",
    "memory": "memory in bytes such as 512Mi or 1Gi",
    "percent": "a percentage from 0 to 100 such as 85",
    "number": "a number such as 30 or 2.5",
}
#: Longest profile text accepted: bounds the schema's cost and any annotation's.
MAX_LENGTH = 128


def pattern(kind: Kind) -> str:
    """The schema pattern of a ``kind`` amount or profile (anchored)."""
    value = _VALUES[kind]
    return (rf"^({value}|ramp\( *{value} *, *{value} *, *{DURATION} *\)"
            rf"|sine\( *{value} *, *{value} *, *{PERIOD} *\))$")


def syntax(kind: Kind) -> str:
    """What a ``kind`` profile looks like, for messages."""
    return (f"{_EXAMPLES[kind]}, ramp(FROM, TO, DURATION) or sine(FROM, TO, PERIOD), e.g. "
            + {"cpu": "ramp(100m, 2, 5m)", "memory": "sine(256Mi, 1Gi, 10m)",
               "percent": "sine(40, 95, 2m)", "number": "ramp(0, 40, 5m)"}[kind])


_COMPILED = {kind: re.compile(pattern(kind)) for kind in _VALUES}  # type: ignore[arg-type]
_CALL = re.compile(r"^(ramp|sine)\((.*)\)$")

_SUFFIXES: dict[str, decimal.Decimal] = {
    "n": decimal.Decimal("1e-9"), "u": decimal.Decimal("1e-6"), "m": decimal.Decimal("1e-3"),
    "": decimal.Decimal(1), "k": decimal.Decimal("1e3"), "M": decimal.Decimal("1e6"),
    "G": decimal.Decimal("1e9"), "T": decimal.Decimal("1e12"), "P": decimal.Decimal("1e15"),
    "E": decimal.Decimal("1e18"),
    **{f"{prefix}i": decimal.Decimal(1024) ** power
       for power, prefix in enumerate("KMGTPE", start=1)},
}
_NUMBER = re.compile(r"^([0-9.]+)((?:[KMGTPE]i)|[numkMGTPE]|(?:[eE][-+]?[0-9.]+))?$")


def quantity(text: str) -> float:
    """The value of a non-negative quantity ("250m" → 0.25, "1Gi" → 1073741824.0)."""
    match = _NUMBER.match(text.strip())
    if match is None or not re.fullmatch(QUANTITY, text.strip()):
        raise ValueError(f"{text!r} is not a quantity such as 250m, 2 or 1Gi")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return float(decimal.Decimal(number + suffix))
    return float(decimal.Decimal(number) * _SUFFIXES[suffix])


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """An amount over time: ``start`` at t=0, ``end`` at ``duration`` (a ramp), or a wave
    between them with period ``duration`` (a sine); a constant has ``start == end``."""

    shape: Literal["constant", "ramp", "sine"]
    start: float
    end: float = 0.0
    duration: float = 0.0

    @classmethod
    def constant(cls, value: float) -> Profile:
        return cls("constant", value, value)

    def at(self, t: float) -> float:
        """The amount ``t`` seconds after the container started (0 before it started)."""
        if t < 0:
            return 0.0
        if self.shape == "constant":
            return self.start
        if self.shape == "ramp":
            if t >= self.duration:
                return self.end
            return self.start + (self.end - self.start) * t / self.duration
        phase = 2 * math.pi * t / self.duration
        return self.start + (self.end - self.start) * (1 - math.cos(phase)) / 2

    def integral(self, t0: float, t1: float) -> float:
        """The amount integrated from ``t0`` to ``t1`` seconds after the start (what a CPU
        counter gains between them); 0 for the time before the start."""
        t0, t1 = max(t0, 0.0), max(t1, 0.0)
        if t1 <= t0:
            return 0.0
        return self._antiderivative(t1) - self._antiderivative(t0)

    def _antiderivative(self, t: float) -> float:
        if self.shape == "constant":
            return self.start * t
        if self.shape == "ramp":
            if t >= self.duration:
                ramped = (self.start + self.end) * self.duration / 2
                return ramped + self.end * (t - self.duration)
            slope = (self.end - self.start) / self.duration
            return self.start * t + slope * t * t / 2
        # start + (end - start)(1 - cos(2πt/T))/2 = mean - amplitude·cos(2πt/T)
        mean, amplitude = (self.start + self.end) / 2, (self.end - self.start) / 2
        omega = 2 * math.pi / self.duration
        return mean * t - amplitude * math.sin(omega * t) / omega

    @property
    def peak(self) -> float:
        return max(self.start, self.end)


def parse(text: str, kind: Kind) -> Profile:
    """The profile ``text`` describes; ValueError saying what is accepted otherwise."""
    stripped = text.strip()
    if len(stripped) > MAX_LENGTH or not _COMPILED[kind].match(stripped):
        raise ValueError(f"{text!r} is not {syntax(kind)}")
    call = _CALL.match(stripped)
    if call is None:
        return Profile.constant(_value(stripped, kind))
    first, second, time = (part.strip() for part in call.group(2).split(","))
    shape: Literal["ramp", "sine"] = "ramp" if call.group(1) == "ramp" else "sine"
    return Profile(shape, _value(first, kind), _value(second, kind), parse_duration(time))


def _value(text: str, kind: Kind) -> float:
    return float(text) if kind == "percent" else quantity(text)
