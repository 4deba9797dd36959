"""Reading the API server's own request counters (``/metrics``, apiserver_request_total)."""

from __future__ import annotations

import re

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
_SAMPLE = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def mutating_requests(metrics: str) -> dict[str, int]:
    """Mutating requests served so far, keyed "VERB resource[/subresource]"."""
    return {key: count for key, count in all_requests(metrics).items()
            if key.split(" ", 1)[0] in MUTATING}


def all_requests(metrics: str) -> dict[str, int]:
    """Every request served so far (reads, watches and writes, whatever their answer), keyed
    "VERB resource[/subresource]"."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(1)))
        if "verb" not in labels:
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = f"{labels['verb']} {resource}"
        counts[key] = counts.get(key, 0) + int(float(match.group(2)))
    return counts


_DISPATCHED = re.compile(
    r"^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\} ([0-9.e+]+)$")


def dispatched_requests(metrics: str) -> dict[str, int]:
    """Requests API Priority and Fairness let through so far, by the flow schema that matched
    them (who sent them: ``system-nodes`` is a node's identity, ``exempt`` the admin's)."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        match = _DISPATCHED.match(line)
        if not match:
            continue
        schema = dict(_LABEL.findall(match.group(1))).get("flow_schema", "")
        counts[schema] = counts.get(schema, 0) + int(float(match.group(2)))
    return counts


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What each counter gained from ``before`` to ``after`` (those that gained nothing left
    out)."""
    return {key: count - before.get(key, 0) for key, count in after.items()
            if count > before.get(key, 0)}


_WAIT = re.compile(
    r"^apiserver_flowcontrol_request_wait_duration_seconds_(sum|count)\{([^}]*)\} ([0-9.e+]+)$")


def throttled_requests(metrics: str) -> dict[str, int]:
    """Requests the API server answered 429 so far (API Priority and Fairness had no room in
    the request's queues), keyed "VERB resource[/subresource]"."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(1)))
        if labels.get("code") != "429":
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = f"{labels.get('verb', '')} {resource}"
        counts[key] = counts.get(key, 0) + int(float(match.group(2)))
    return counts


def queue_waits(metrics: str) -> dict[str, tuple[float, int]]:
    """Per APF priority level: the seconds requests waited in its queues so far, summed, and
    how many requests that was (apiserver_flowcontrol_request_wait_duration_seconds)."""
    waits: dict[str, tuple[float, int]] = {}
    for line in metrics.splitlines():
        match = _WAIT.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        level = labels.get("priority_level", "")
        total, count = waits.get(level, (0.0, 0))
        if match.group(1) == "sum":
            total += float(match.group(3))
        else:
            count += int(float(match.group(3)))
        waits[level] = (total, count)
    return waits
