"""The order in which ``make test`` hands test files to its two xdist workers: longest first.

With ``--dist loadfile`` a worker that runs low takes the next whole file from a queue. By
default xdist sorts that queue by the number of tests in a file, which puts the e2e files of one
or two long tests (a property test against a real fleet, a 75-second fault) at its very end:
whichever of them comes last can start when the other worker has little left, and keep the
run going alone. ``make test`` passes ``--no-loadscope-reorder`` so that the queue is the
collection order, and ``e2e/conftest.py`` collects the files below longest first (the classic
longest-processing-time packing); the short files fill in at the end in their usual order.

This only orders, it decides nothing a test sees: each file still gets its own fixtures.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

#: About how long each slow file takes in a warm ``make test`` on two workers, in seconds: its
#: ``--durations`` summed (setup and teardown included) and rounded. Only the order matters, so
#: a rough figure is enough; every e2e file is named (tests/test_e2e_ordering.py checks it), a
#: file missing counts as quick.
SECONDS: dict[str, int] = {
    "e2e/test_federation.py": 280,
    "e2e/test_snapshots.py": 250,
    "e2e/test_faults.py": 270,
    "e2e/test_operator.py": 240,
    "e2e/test_conformance.py": 210,
    "e2e/test_kueue.py": 170,
    "e2e/test_bench_smoke.py": 140,
    "e2e/test_restarts.py": 160,
    "e2e/test_crd_properties.py": 130,
    "e2e/test_cli.py": 120,
    "e2e/test_metrics.py": 120,
    "e2e/test_ownership.py": 95,
    "e2e/test_chart.py": 100,
    "e2e/test_karpenter.py": 95,
    "e2e/test_recording.py": 125,
    "e2e/test_custom_metrics.py": 90,
    "e2e/test_kuberay.py": 80,
    "e2e/test_dra.py": 75,
    "e2e/test_validation.py": 75,
    "e2e/test_kubelet_streaming.py": 70,
    "e2e/test_pods.py": 60,
    "e2e/test_replay.py": 70,
    "e2e/test_kubelet_api.py": 45,
    "e2e/test_controlplane.py": 40,
    "e2e/test_tracing.py": 30,
    "tests/federation/test_fuzz.py": 50,
}


def file_of(nodeid: str) -> str:
    """The file part of a test's node id (``e2e/test_cli.py::test_x[a]`` → ``e2e/test_cli.py``)."""
    return nodeid.split("::", 1)[0]


def longest_first(items: Sequence[pytest.Item]) -> list[pytest.Item]:
    """``items`` with the files of :data:`SECONDS` first, longest first; the rest after, in
    their order. A file's tests stay together and in their order (the sort is stable)."""
    return sorted(items, key=lambda item: -SECONDS.get(file_of(item.nodeid), 0))
