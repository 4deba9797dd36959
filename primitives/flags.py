"""Numeric command-line flags, checked as they are parsed: ``argparse`` types that take a finite
number within bounds and refuse the rest with the value and the range.

``float()`` takes ``nan`` and ``inf``, and a ``<= 0`` check lets ``nan`` through (every
comparison with it is false); an interval of 0 turns a loop into a busy one. So every
entry point (hub, collector, operator, engine, daemon) bounds each number it reads, both ways,
in the same words. argparse puts the flag in front: ``argument --grace: 'nan' is not a number
of seconds from 0.2 to 3600``.

Relations between flags (a grace longer than the heartbeat interval) are checked by the entry
point after parsing, with ``parser.error``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number(lo: float, hi: float, what: str = "a number") -> Callable[[str], float]:
    """An argparse ``type``: a finite float from ``lo`` to ``hi`` (both included)."""
    _check_bounds(lo, hi)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not lo <= value <= hi:  # nan fails both comparisons, inf the finite upper bound
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} from {lo:g} to {hi:g}")
        return value

    return parse


def integer(lo: int, hi: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argparse ``type``: an int from ``lo`` to ``hi`` (both included)."""
    _check_bounds(lo, hi)

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = lo - 1
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} from {lo} to {hi}")
        return value

    return parse


def _check_bounds(lo: float, hi: float) -> None:
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"bounds [{lo}, {hi}]: give finite bounds, the lower one first")
