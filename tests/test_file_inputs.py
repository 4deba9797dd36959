"""Every file a user hands fakefleet, fuzzed: a workload for 'fleet submit', FaultPlans for
'plan run', a fleet plan for 'fleet run', stages for 'python -m operators.engine --stages'.

Whatever the file holds (not YAML, not UTF-8, a list where a mapping belongs, a number where a
name belongs, the examples with parts replaced), the reader either takes it or raises its one
error type with a message that names the file: never another exception, which the command
line would show as a traceback.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from operators.api.stages import StageError, load_lifecycle
from operators.cli import fleets, workloads
from operators.cli.connecting import FleetError
from operators.cli.planreading import read_plans
from operators.controlplane.errors import StateError

ROOT = Path(__file__).resolve().parent.parent
NAME = "input.yaml"

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=20)


def _paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, example: Any) -> Any:
    """The example with one part (the whole document included) replaced by anything."""
    paths = _paths(example)
    path = draw(st.sampled_from(paths))
    replacement = draw(values)
    if not path:
        return replacement
    document = yaml.safe_load(yaml.safe_dump(example))
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = replacement
    return document


def _examples(path: str) -> list[Any]:
    return [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d is not None]


def _file(data: bytes) -> io.TextIOWrapper:
    raw = io.BytesIO(data)
    raw.name = NAME  # type: ignore[attr-defined]
    return io.TextIOWrapper(raw, encoding="utf-8")


def _documents(example: Any) -> st.SearchStrategy[bytes]:
    return st.one_of(
        mutated(example).map(lambda d: yaml.safe_dump(d).encode()),
        st.binary(max_size=200),
        st.text(max_size=200).map(str.encode),
    )


def _check(read: Callable[[io.TextIOWrapper], object], error: type[Exception],
           data: bytes) -> None:
    refusal = ""
    try:
        read(_file(data))
    except error as refused:
        refusal = str(refused.message if isinstance(refused, FleetError) else refused)
    if refusal:
        assert NAME in refusal


FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])
WORKLOAD = _examples("examples/workloads/spread.yaml")[0]
PLAN = _examples("examples/fleet/xid-then-partition.yaml")[0]
STAGES = yaml.safe_load((ROOT / "operators/engine/stages.yaml").read_text())


@FUZZ
@given(data=_documents(WORKLOAD))
def test_a_workload_file_is_taken_or_refused_by_name(data: bytes) -> None:
    _check(workloads.read_workload, FleetError, data)


@FUZZ
@given(data=_documents(PLAN))
def test_a_fleet_plan_file_is_taken_or_refused_by_name(data: bytes) -> None:
    _check(fleets._plan_spec, FleetError, data)


@FUZZ
@given(data=_documents(PLAN))
def test_faultplan_files_are_taken_or_refused_by_name(data: bytes) -> None:
    _check(lambda file: read_plans(file, None), StateError, data)


@FUZZ
@given(data=_documents(STAGES))
def test_a_stages_file_is_taken_or_refused_by_name(data: bytes) -> None:
    def read(file: io.TextIOWrapper) -> object:
        try:
            text = file.read()
        except UnicodeDecodeError:
            return None  # the engine reads its --stages file as bytes it decodes; not this
        return load_lifecycle(text, source=NAME)

    _check(read, StageError, data)


@pytest.mark.parametrize("text", ["[1, 2]", "just words", "kind: Workload\nmetadata: oops\n",
                                  "kind: Workload\nspec: [1]\n"])
def test_known_shapes_of_a_bad_workload_are_refused_by_name(text: str) -> None:
    _check(workloads.read_workload, FleetError, text.encode())
