"""The Prometheus text exposition format (version 0.0.4), as much of it as the kubelet and
dcgm-exporter write: ``# HELP``/``# TYPE`` headers, samples with labels, millisecond timestamps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape(value: str) -> str:
    """A label value as the format quotes it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(pairs: Iterable[tuple[str, str]]) -> str:
    """``{a="1",b="2"}``, or "" for no labels."""
    rendered = ",".join(f'{name}="{escape(value)}"' for name, value in pairs)
    return f"{{{rendered}}}" if rendered else ""


def number(value: float) -> str:
    """A sample value: integers without a fraction, others in Python's shortest exact form
    (which Go's ParseFloat, and so Prometheus and metrics-server, read back exactly)."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def family(name: str, kind: str, help_text: str,
           samples: Sequence[tuple[str, float]], timestamp: int | None = None) -> list[str]:
    """One metric family: its headers, then a line per (labels, value) sample."""
    suffix = f" {timestamp}" if timestamp is not None else ""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{rendered} {number(value)}{suffix}" for rendered, value in samples]
    return lines
