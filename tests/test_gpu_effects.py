"""What faults do to a node's GPUs, as stage effects: which GPUs a GPUXid hits, what a
Condition fault does to temperature and clocks, how the engine applies and restores it. Pure."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from operators.api.faultplans import Fault
from operators.api.stages import GPUEffect, NodeEffect
from operators.engine import nodes
from operators.engine.nodes import GPUState
from operators.faults import catalogue


def gpu_effects(entry_stages: list[object]) -> list[dict[str, object]]:
    return [stage.effect.gpus.model_dump(exclude_defaults=True)  # type: ignore[attr-defined]
            for stage in entry_stages
            if getattr(stage.effect, "gpus", None) is not None]  # type: ignore[attr-defined]


def test_a_fatal_xid_records_the_first_gpus_it_hits_and_its_recovery_resets_them() -> None:
    entry = catalogue.node_entry("e", Fault(type="GPUXid", xid=79, gpus=2), gpus=8)
    assert gpu_effects(entry.stages) == [{"indices": [0, 1], "xid": 79, "healthy": False}]
    assert gpu_effects(entry.recovery) == [{"indices": [0, 1], "reset": True}]
    assert entry.stages[0].effect.allocatable == {"nvidia.com/gpu": "6"}  # type: ignore[union-attr]


def test_a_signal_only_xid_is_recorded_without_taking_the_gpu_out() -> None:
    entry = catalogue.node_entry("e", Fault(type="GPUXid", xid=13), gpus=8)
    assert gpu_effects(entry.stages) == [{"indices": [0], "xid": 13}]


def test_an_xid_on_a_node_without_gpus_names_none() -> None:
    entry = catalogue.node_entry("e", Fault(type="GPUXid", xid=79), gpus=0)
    assert gpu_effects(entry.stages) == []


def test_a_condition_fault_heats_all_gpus_or_the_first_few() -> None:
    hot = {"type": "Condition", "condition": {"type": "GPUThermalSlowdown"},
           "gpu": {"temperature": 94}}
    entry = catalogue.node_entry("e", Fault.model_validate(hot), gpus=4)
    assert gpu_effects(entry.stages) == [{"indices": [0, 1, 2, 3], "temperature": 94}]
    assert gpu_effects(entry.recovery) == [{"indices": [0, 1, 2, 3], "reset": True}]
    entry = catalogue.node_entry("e", Fault.model_validate({**hot, "gpus": 1}), gpus=4)
    assert gpu_effects(entry.stages) == [{"indices": [0], "temperature": 94}]
    plain = {"type": "Condition", "condition": {"type": "KernelDeadlock"}}
    assert gpu_effects(catalogue.node_entry("e", Fault.model_validate(plain), gpus=4).stages) \
        == []


def test_a_gpu_effect_does_something_and_a_reset_nothing_else() -> None:
    with pytest.raises(ValidationError, match="does nothing"):
        GPUEffect(indices=[0])
    with pytest.raises(ValidationError, match="takes no xid"):
        GPUEffect(indices=[0], reset=True, xid=79)
    with pytest.raises(ValidationError):
        GPUEffect(indices=[16], xid=79)
    assert NodeEffect(gpus=GPUEffect(indices=[1], smClock=900)).gpus is not None


def test_gpu_states_apply_in_order_and_a_reset_restores_them() -> None:
    states = nodes.apply_gpus((), GPUEffect(indices=[0, 2], xid=79, healthy=False))
    states = nodes.apply_gpus(states, GPUEffect(indices=[2, 3], temperature=90))
    assert states == ((0, GPUState(xid=79, healthy=False)),
                      (2, GPUState(xid=79, healthy=False, temperature=90)),
                      (3, GPUState(temperature=90)))
    states = nodes.apply_gpus(states, GPUEffect(indices=[0, 2], reset=True))
    assert states == ((3, GPUState(temperature=90)),)
    life = nodes.NodeLife(gpus=states)
    assert life.gpu(3).temperature == 90
    assert life.gpu(1) == GPUState()


def test_a_restarted_engine_reads_the_gpu_states_from_the_entries_in_force() -> None:
    fatal = catalogue.node_entry("a", Fault(type="GPUXid", xid=79), gpus=8)
    signal = catalogue.node_entry("b", Fault(type="GPUXid", xid=13, gpus=2), gpus=8)
    signal = signal.model_copy(update={"state": "done"})
    recovering = catalogue.node_entry("c", Fault(type="GPUXid", xid=48, gpus=2), gpus=8)
    recovering = recovering.model_copy(update={"state": "recover"})
    states = dict(nodes.gpus_from_entries([fatal, signal, recovering]))
    assert states == {0: GPUState(xid=48, healthy=False), 1: GPUState(xid=48, healthy=False)}, \
        "a done signal is forgotten; one still recovering is in force until its reset"
    assert nodes.gpus_from_entries([]) == ()
