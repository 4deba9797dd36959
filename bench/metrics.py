"""Reading the API server's own request counters (``/metrics``, apiserver_request_total)."""

from __future__ import annotations

import re

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE", "APPLY"})
_SAMPLE = re.compile(r"^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def mutating_requests(metrics: str) -> dict[str, int]:
    """Mutating requests served so far, keyed "VERB resource[/subresource]"."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if not match:
            continue
        labels = dict(_LABEL.findall(match.group(1)))
        if labels.get("verb") not in MUTATING:
            continue
        resource = labels.get("resource", "")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = f"{labels['verb']} {resource}"
        counts[key] = counts.get(key, 0) + int(float(match.group(2)))
    return counts
