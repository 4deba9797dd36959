"""Kubernetes' time formats: ``Time`` (RFC 3339, seconds) and ``MicroTime`` (Lease renewals)."""

from __future__ import annotations

import datetime
import time


def rfc3339(now: float | None = None) -> str:
    """``metav1.Time`` of ``now`` (seconds since the epoch; default: the current time)."""
    moment = datetime.datetime.fromtimestamp(time.time() if now is None else now, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(now: float | None = None) -> str:
    """``metav1.MicroTime`` of ``now``, as Lease.spec.renewTime wants it."""
    moment = datetime.datetime.fromtimestamp(time.time() if now is None else now, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse(stamp: str) -> float:
    """Seconds since the epoch of a Time or MicroTime string."""
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
