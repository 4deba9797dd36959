"""Durations as users write them in YAML and annotations: ``90s``, ``1m30s``, ``500ms``, ``2h``."""

from __future__ import annotations

import re

#: The schema pattern; :func:`parse_duration` accepts exactly these strings.
DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``; ValueError naming the accepted form otherwise."""
    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration such as 90s, 1m30s, 500ms or 2h")
    return sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text))
