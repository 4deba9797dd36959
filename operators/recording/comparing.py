"""Two recorded runs of one scenario compared: which objects' event sequences
(:mod:`~operators.recording.sequencing`; objects matched across the runs by
:mod:`~operators.recording.matching`) are identical, where the first one parts, and how far
the runs agree on what people look at (placements, pod outcomes, FaultPlan verdicts, and the
time each object took to reach its final state).

The runs' clusters are matched by name; two traces of one cluster each are matched whatever
their clusters are called (two replays recorded under two names). Traces of different sets of
clusters are not runs of one scenario (:class:`CompareError`).

Two runs are *identical* when every object is in both, every object's sequence is the same,
and so (since they are facts of the sequences) are placements, outcomes and verdicts. Times
always differ a little; they make the runs differ only past a tolerance the caller gives.
Pure: traces in, a :class:`Comparison` out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from operators.recording import sequencing
from operators.recording.matching import History, Key, Run, histories
from operators.recording.trace import Trace

NANOS = 1e9


class CompareError(ValueError):
    """Two traces that are not runs of one scenario; the message says why and what to give."""


@dataclasses.dataclass(frozen=True)
class Share:
    """How many of ``total`` agree."""

    same: int
    total: int

    @property
    def ratio(self) -> float:
        return self.same / self.total if self.total else 1.0

    def fields(self) -> dict[str, Any]:
        return {"same": self.same, "total": self.total, "share": round(self.ratio, 4)}


@dataclasses.dataclass(frozen=True)
class Divergence:
    """Where one object's sequences part: the first event index that differs, each run's
    event there (None: that run's sequence ended, or never began), and when."""

    key: Key
    index: int
    a: str | None
    b: str | None
    at_a: int | None
    at_b: int | None
    names_a: tuple[str, ...]
    names_b: tuple[str, ...]

    @property
    def at(self) -> int:
        """When the runs parted: the earlier of the two events."""
        return min(t for t in (self.at_a, self.at_b) if t is not None)

    def fields(self) -> dict[str, Any]:
        return {"object": self.key.text(), "cluster": self.key.cluster, "kind": self.key.kind,
                "namespace": self.key.namespace, "matchedAs": self.key.name,
                "namesA": list(self.names_a), "namesB": list(self.names_b),
                "index": self.index, "seconds": self.at / NANOS,
                "a": self.a, "b": self.b,
                "secondsA": None if self.at_a is None else self.at_a / NANOS,
                "secondsB": None if self.at_b is None else self.at_b / NANOS}


@dataclasses.dataclass(frozen=True)
class Difference:
    """One object whose placement, outcome or verdict differs."""

    key: Key
    a: str
    b: str

    def fields(self) -> dict[str, Any]:
        return {"object": self.key.text(), "a": self.a, "b": self.b}


@dataclasses.dataclass(frozen=True)
class Times:
    """Per object, the time it reached its final state (its last event) in each run, and the
    difference between runs: p50 and max over the objects that have events in both."""

    count: int
    p50: int
    max: int
    worst: Key | None
    last_a: int
    last_b: int

    def fields(self) -> dict[str, Any]:
        return {"objects": self.count, "differenceP50Seconds": self.p50 / NANOS,
                "differenceMaxSeconds": self.max / NANOS,
                "worst": None if self.worst is None else self.worst.text(),
                "lastEventSecondsA": self.last_a / NANOS,
                "lastEventSecondsB": self.last_b / NANOS}


@dataclasses.dataclass(frozen=True)
class Comparison:
    clusters: tuple[str, ...]
    sequences: Share
    #: Every object whose sequences differ, the earliest parting first.
    divergences: tuple[Divergence, ...]
    placements: Share
    placement_differences: tuple[Difference, ...]
    outcomes: Share
    outcome_differences: tuple[Difference, ...]
    verdicts: Share
    verdict_pairs: tuple[Difference, ...]
    times: Times
    events_a: int
    events_b: int

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None

    def identical(self, *, tolerance: float | None = None) -> bool:
        """Whether the runs are the same by every measure; with ``tolerance`` (seconds), also
        no object's final state more than that apart."""
        same = not self.divergences and not self.placement_differences and \
            not self.outcome_differences and \
            all(pair.a == pair.b for pair in self.verdict_pairs)
        return same and (tolerance is None or self.times.max <= tolerance * NANOS)

    def fields(self, *, tolerance: float | None = None) -> dict[str, Any]:
        return {
            "identical": self.identical(tolerance=tolerance),
            "clusters": list(self.clusters),
            "events": {"a": self.events_a, "b": self.events_b},
            "sequences": self.sequences.fields(),
            "firstDivergence": None if self.first is None else self.first.fields(),
            "divergences": [d.fields() for d in self.divergences],
            "placements": {**self.placements.fields(),
                           "differ": [d.fields() for d in self.placement_differences]},
            "outcomes": {**self.outcomes.fields(),
                         "differ": [d.fields() for d in self.outcome_differences]},
            "verdicts": {**self.verdicts.fields(),
                         "plans": [d.fields() for d in self.verdict_pairs]},
            "times": {**self.times.fields(), "toleranceSeconds": tolerance},
        }


def paired(a: Trace, b: Trace) -> dict[str, str]:
    """How ``b``'s clusters are named in the comparison (by ``a``'s names)."""
    if len(a.clusters) == 1 and len(b.clusters) == 1:
        return {b.clusters[0]: a.clusters[0]}
    if set(a.clusters) != set(b.clusters):
        raise CompareError(
            f"the runs recorded different clusters ({', '.join(a.clusters) or 'none'} against "
            f"{', '.join(b.clusters) or 'none'}): record the same clusters, under the same "
            f"names, in both runs")
    return {name: name for name in b.clusters}


def compare(a: Trace, b: Trace) -> Comparison:
    """``a`` and ``b`` compared object by object."""
    run_a = histories(a)
    run_b = histories(b, clusters=paired(a, b))
    return compare_runs(run_a, run_b)


def compare_runs(a: Run, b: Run) -> Comparison:
    keys = sorted(a.objects.keys() | b.objects.keys())
    divergences = [d for key in keys
                   if (d := _divergence(key, a.objects.get(key), b.objects.get(key)))]
    divergences.sort(key=lambda d: (d.at, d.key))
    both = [(a.objects[key], b.objects[key]) for key in keys
            if key in a.objects and key in b.objects]
    pods = [(x, y) for x, y in both if x.key.kind == "Pod"]
    placed = [(x, y) for x, y in pods
              if sequencing.placement(x.last) or sequencing.placement(y.last)]
    placements = _differences(placed, lambda h: sequencing.placement(h.last) or "(none)")
    outcomes = _differences(pods, lambda h: sequencing.outcome(h.last).text())
    plans = [(x, y) for x, y in both if x.key.kind == "FaultPlan"]
    verdicts = _differences(plans, lambda h: sequencing.verdict(h.last) or "(none)",
                            every=True)
    return Comparison(
        clusters=a.clusters,
        sequences=Share(len(keys) - len(divergences), len(keys)),
        divergences=tuple(divergences),
        placements=Share(len(placed) - len(placements), len(placed)),
        placement_differences=placements,
        outcomes=Share(len(pods) - len(outcomes), len(pods)),
        outcome_differences=outcomes,
        verdicts=Share(sum(v.a == v.b for v in verdicts), len(verdicts)),
        verdict_pairs=verdicts,
        times=_times(both, a, b),
        events_a=sum(len(h.events) for h in a.objects.values()),
        events_b=sum(len(h.events) for h in b.objects.values()))


def _divergence(key: Key, a: History | None, b: History | None) -> Divergence | None:
    events_a = a.events if a is not None else []
    events_b = b.events if b is not None else []
    if a is not None and b is not None and a.sequence() == b.sequence():
        return None
    index = 0
    while index < min(len(events_a), len(events_b)) and \
            events_a[index].what == events_b[index].what:
        index += 1
    at_a = events_a[index] if index < len(events_a) else None
    at_b = events_b[index] if index < len(events_b) else None
    if at_a is None and at_b is None:  # an object with no events in either run
        return None
    return Divergence(
        key=key, index=index, a=None if at_a is None else at_a.what,
        b=None if at_b is None else at_b.what,
        at_a=None if at_a is None else at_a.at, at_b=None if at_b is None else at_b.at,
        names_a=tuple(a.names) if a else (), names_b=tuple(b.names) if b else ())


def _differences(pairs: Sequence[tuple[History, History]], said: Callable[[History], str], *,
                 every: bool = False) -> tuple[Difference, ...]:
    """The pairs that ``said`` tells apart (``every``: all of them)."""
    return tuple(Difference(x.key, said(x), said(y)) for x, y in pairs
                 if every or said(x) != said(y))


def _times(both: Sequence[tuple[History, History]], a: Run, b: Run) -> Times:
    """Final-state times of the objects that did something in both runs after their zero."""
    apart: list[tuple[int, Key]] = []
    for x, y in both:
        if x.events and y.events and (x.events[-1].at > 0 or y.events[-1].at > 0):
            apart.append((abs(x.events[-1].at - y.events[-1].at), x.key))
    apart.sort()
    last_a = max((h.events[-1].at for h in a.objects.values() if h.events), default=0)
    last_b = max((h.events[-1].at for h in b.objects.values() if h.events), default=0)
    if not apart:
        return Times(0, 0, 0, None, last_a, last_b)
    return Times(len(apart), apart[min(len(apart) // 2, len(apart) - 1)][0], apart[-1][0],
                 apart[-1][1], last_a, last_b)
