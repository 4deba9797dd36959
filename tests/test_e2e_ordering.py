"""The order ``make test`` collects files in (e2e/ordering.py): every e2e file has a recorded
time, so that a new one is placed by its length rather than last by its count of tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from e2e.ordering import SECONDS, file_of, longest_first

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Item:
    nodeid: str


def test_every_e2e_file_and_only_those_that_exist_have_a_recorded_time() -> None:
    e2e = {f"e2e/{path.name}" for path in (ROOT / "e2e").glob("test_*.py")}
    assert e2e <= set(SECONDS), f"record about how long these take: {sorted(e2e - set(SECONDS))}"
    gone = {name for name in SECONDS if not (ROOT / name).is_file()}
    assert not gone, f"these files are gone, drop them from e2e/ordering.py: {sorted(gone)}"


def test_longest_files_go_first_and_each_file_s_tests_stay_together_in_order() -> None:
    ids = ["tests/test_a.py::test_one", "tests/test_a.py::test_two",
           "e2e/test_tracing.py::test_x", "e2e/test_operator.py::test_p[1]",
           "e2e/test_operator.py::test_p[2]", "tests/test_b.py::test_three"]
    ordered = [item.nodeid for item in longest_first([Item(i) for i in ids])]
    assert ordered == ["e2e/test_operator.py::test_p[1]", "e2e/test_operator.py::test_p[2]",
                       "e2e/test_tracing.py::test_x",
                       "tests/test_a.py::test_one", "tests/test_a.py::test_two",
                       "tests/test_b.py::test_three"]


def test_the_file_of_a_parametrized_test_is_its_path() -> None:
    assert file_of("e2e/test_kubelet_streaming.py::test_t[spdy-8000]") == \
        "e2e/test_kubelet_streaming.py"
