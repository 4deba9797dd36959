"""Durations as users write them in YAML and annotations: ``90s``, ``1m30s``, ``500ms``, ``2h``."""

from __future__ import annotations

import re

#: The schema pattern; :func:`parse_duration` accepts exactly these strings. At most seven
#: digits before a unit's point, and (with the schema's 32 characters) at most four such parts:
#: 4e7 hours, some 4500 years, which a timestamp still holds; a longer number of digits became
#: infinity and broke every date computed from it.
DURATION_PATTERN = r"^([0-9]{1,7}(\.[0-9]{1,9})?(ms|s|m|h))+$"
#: What every duration field of the CRDs allows, in characters.
DURATION_LENGTH = 32
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``; ValueError naming the accepted form otherwise."""
    if len(text) > DURATION_LENGTH or not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"{text[:40]!r} is not a duration such as 90s, 1m30s, 500ms or 2h "
                         f"(at most {DURATION_LENGTH} characters, 7 digits before a unit)")
    return sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text))
