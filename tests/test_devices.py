"""Fake GPUs as DRA devices: the ResourceSlice and DeviceClass as rendered, read back and
planned (pure); what gpu.allocation does to a node's capacity."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest

from operators.api.gpus import DRA_DRIVER, PRESETS, gpu_uuid
from operators.api.nodepools import MAX_NODES_PER_CLUSTER, MAX_POOL_NAME_LENGTH, FakeNodePoolSpec
from operators.engine import devices
from operators.engine.devices import Publish, SliceFacts, Wanted, Withdraw
from operators.engine.nodes import node_name, node_shape

CLUSTER = "default.west"
#: semver.org's own expression for a version (without pre-release and build parts).
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_ID = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def spec(allocation: str = "dra", **gpu: Any) -> FakeNodePoolSpec:
    return FakeNodePoolSpec.model_validate({
        "clusterRef": "west", "gpu": {"preset": "H100-SXM5-80GB", "allocation": allocation,
                                      **gpu}})


def want(node: str = "h100-0", uid: str = "uid-1", **gpu: Any) -> Wanted:
    return Wanted(node, uid, "h100", spec(**gpu))


def rendered(obj: Wanted, out: dict[int, Any] | None = None, generation: int = 1) -> Any:
    return devices.render_slice(CLUSTER, obj, out=out or {}, generation=generation)


# -- capacity ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("allocation", "extended", "publishes"), [
    ("extended", True, False), ("dra", False, True), ("both", True, True)])
def test_allocation_decides_between_the_extended_resource_and_devices(
        allocation: str, extended: bool, publishes: bool) -> None:
    pool = spec(allocation)
    assert ("nvidia.com/gpu" in pool.node_capacity()) is extended
    assert pool.publishes_devices is publishes
    # Every way, the node says what GPUs it has, as GPU Feature Discovery does.
    assert node_shape(CLUSTER, "h100", pool, 0)["labels"]["nvidia.com/gpu.count"] == "8"


def test_extended_is_the_default_as_before() -> None:
    pool = FakeNodePoolSpec.model_validate({"clusterRef": "west",
                                            "gpu": {"preset": "B200", "count": 4}})
    assert pool.gpu is not None
    assert pool.gpu.allocation == "extended"
    assert pool.node_capacity()["nvidia.com/gpu"] == "4"
    assert not pool.publishes_devices


def test_a_change_of_allocation_reshapes_the_nodes() -> None:
    from operators.engine.nodes import template_hash
    assert template_hash(spec("extended")) != template_hash(spec("dra"))


# -- the slice ---------------------------------------------------------------------------------

def test_one_device_per_gpu_with_its_attributes_and_capacity() -> None:
    body = rendered(want(count=4))
    preset = PRESETS["H100-SXM5-80GB"]
    assert body["apiVersion"] == "resource.k8s.io/v1"
    assert body["spec"]["driver"] == DRA_DRIVER
    assert body["spec"]["nodeName"] == "h100-0"
    assert body["spec"]["pool"] == {"name": "h100-0", "generation": 1, "resourceSliceCount": 1}
    listed = body["spec"]["devices"]
    assert [d["name"] for d in listed] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    third = listed[2]
    assert third["attributes"] == {
        "productName": {"string": preset.product},
        "architecture": {"string": "hopper"},
        "uuid": {"string": gpu_uuid(CLUSTER, "h100-0", 2)},
        "index": {"int": 2},
        "memory": {"int": preset.memory_mib},
        "driverVersion": {"version": "570.133.20"},
    }
    assert third["capacity"] == {"memory": {"value": f"{preset.memory_mib}Mi"}}
    assert "taints" not in third


def test_the_slice_is_owned_by_its_node_and_labelled_with_its_pool() -> None:
    metadata = rendered(want(uid="node-uid"))["metadata"]
    assert metadata["name"] == "h100-0-gpu.fakefleet.dev"
    assert metadata["ownerReferences"] == [{"apiVersion": "v1", "kind": "Node",
                                            "name": "h100-0", "uid": "node-uid",
                                            "controller": True}]
    assert metadata["labels"] == {"fakefleet.dev/pool": "h100"}


def test_what_the_api_server_validates_holds_for_every_preset_and_the_longest_names() -> None:
    """ResourceSlice validation at 1.36: the name a DNS subdomain, attribute and capacity names
    at most 32 characters, at most 32 of them per device, string and version values at most 64
    characters, versions semver, at most 64 devices when any is tainted."""
    node = node_name("p" * MAX_POOL_NAME_LENGTH, MAX_NODES_PER_CLUSTER - 1)
    for preset in PRESETS:
        longest = ".".join(["9" * 10] * 3)
        obj = Wanted(node, "uid", "p", FakeNodePoolSpec.model_validate({
            "clusterRef": "c" * 63, "gpu": {"preset": preset, "allocation": "dra",
                                            "count": 16, "driverVersion": longest}}))
        body = devices.render_slice("c" * 63 + "." + "c" * 63, obj,
                                    out={i: devices.unhealthy_taint("Xid79") for i in range(16)},
                                    generation=1)
        name = body["metadata"]["name"]
        assert len(name) <= 253
        assert DNS_SUBDOMAIN.match(name)
        assert len(body["spec"]["pool"]["name"]) <= 253
        assert len(body["spec"]["devices"]) <= 64
        for device in body["spec"]["devices"]:
            keys = [*device["attributes"], *device["capacity"]]
            assert len(keys) <= 32
            assert all(len(key) <= 32 and QUALIFIED_ID.match(key) for key in keys)
            for value in device["attributes"].values():
                text = value.get("string") or value.get("version") or ""
                assert len(text) <= 64
            assert SEMVER.match(device["attributes"]["driverVersion"]["version"])
            assert len(device["taints"]) <= 16


@pytest.mark.parametrize(("version", "expected"), [
    ("570.133.20", "570.133.20"), ("570.133", "570.133.0"), ("535.104.05", "535.104.5"),
    ("0.0.0", "0.0.0"), ("007.1", "7.1.0")])
def test_driver_versions_become_semantic_versions(version: str, expected: str) -> None:
    assert devices.semver(version) == expected
    assert SEMVER.match(expected)


def test_the_device_class_selects_the_driver_s_devices() -> None:
    body = devices.device_class()
    assert body["metadata"]["name"] == "gpu.fakefleet.dev"
    assert body["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.fakefleet.dev"'}}]


def test_what_a_slice_is_made_of_is_pinned_to_its_format() -> None:
    """Digests come from what a slice is made of, not from the slice: a change of what
    render_slice writes must bump devices.FORMAT, so that every slice is written once again
    by the new engine, and then this pin."""
    body = rendered(want(), {1: devices.unhealthy_taint("Xid79")})
    pin = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    assert (devices.FORMAT, pin) == (
        1, "269dcf8379747a7140e0db9d5e7b9927d9cc259e0275459654a52f7da6594de0")


def test_the_digest_follows_every_input_of_the_slice() -> None:
    base = want()
    taint = devices.unhealthy_taint("Xid79")
    seen = {devices.digest(CLUSTER, base, {}),
            devices.digest("default.east", base, {}),
            devices.digest(CLUSTER, want(uid="uid-2"), {}),
            devices.digest(CLUSTER, want("h100-1"), {}),
            devices.digest(CLUSTER, want(count=4), {}),
            devices.digest(CLUSTER, want(preset="B200"), {}),
            devices.digest(CLUSTER, want(driverVersion="580.65.6"), {}),
            devices.digest(CLUSTER, base, {0: taint}),
            devices.digest(CLUSTER, base, {0: {**taint, "value": "Xid48"}})}
    assert len(seen) == 9
    # Not what the API server adds, nor GPUs the node does not have.
    assert devices.digest(CLUSTER, base, {0: {**taint, "timeAdded": "2026-01-01T00:00:00Z"}}) \
        == devices.digest(CLUSTER, base, {0: taint})
    assert devices.digest(CLUSTER, base, {12: taint}) == devices.digest(CLUSTER, base, {})


# -- read back ---------------------------------------------------------------------------------

def api_answer(body: dict[str, Any], *, uid: str = "slice-uid", version: str = "7") -> Any:
    """``body`` as the API server keeps it: uid, resourceVersion, taints stamped."""
    obj = {**body, "metadata": {**body["metadata"], "uid": uid, "resourceVersion": version}}
    for device in obj["spec"]["devices"]:
        for taint in device.get("taints", ()):
            taint.setdefault("timeAdded", "2026-01-01T00:00:00Z")
    return obj


def test_a_slice_reads_back_as_written_with_the_gpus_out_of_service() -> None:
    obj = want()
    body = api_answer(rendered(obj, {1: devices.unhealthy_taint("Xid79")}, generation=3))
    facts = devices.observe_slice(body)
    assert facts is not None
    assert (facts.name, facts.node, facts.uid, facts.owner) == (
        "h100-0-gpu.fakefleet.dev", "h100-0", "slice-uid", "uid-1")
    assert (facts.generation, facts.resource_version) == (3, "7")
    assert list(facts.out) == [1]
    assert facts.out[1]["timeAdded"] == "2026-01-01T00:00:00Z"
    # What the API server added changes nothing the engine chose.
    assert facts.digest == devices.digest(CLUSTER, obj, facts.out)


def test_slices_of_other_drivers_are_not_the_engine_s() -> None:
    body = rendered(want())
    assert devices.observe_slice({**body, "spec": {**body["spec"], "driver": "gpu.nvidia.com"}}) \
        is None
    assert devices.observe_slice({**body, "spec": {**body["spec"], "nodeName": None}}) is None


def test_health_changes_take_gpus_out_and_back_and_keep_a_taint_s_time() -> None:
    stamped = {**devices.unhealthy_taint("Xid48"), "timeAdded": "2026-01-01T00:00:00Z"}
    out = devices.with_health({0: stamped}, [0, 1, 9], healthy=False, reason="Xid79", gpus=8)
    assert out == {0: stamped, 1: devices.unhealthy_taint("Xid79")}  # 9: no such GPU
    assert devices.with_health(out, [0], healthy=True, reason="Xid79", gpus=8) == {
        1: devices.unhealthy_taint("Xid79")}


# -- planning ----------------------------------------------------------------------------------

def facts_of(obj: Wanted, out: dict[int, Any] | None = None, **changes: Any) -> SliceFacts:
    found = devices.observe_slice(api_answer(rendered(obj, out)))
    assert found is not None
    return SliceFacts(**{**{f: getattr(found, f) for f in found.__slots__}, **changes})


def test_nodes_without_a_slice_get_one_and_published_ones_nothing() -> None:
    first, second = want("h100-0"), want("h100-1", uid="uid-2")
    observed = {"h100-0-gpu.fakefleet.dev": facts_of(first)}
    assert devices.plan(CLUSTER, [second, first], observed) == [Publish("h100-1")]
    observed["h100-1-gpu.fakefleet.dev"] = facts_of(second)
    assert devices.plan(CLUSTER, [first, second], observed) == []


def test_gpus_out_of_service_stay_out_when_planned_again() -> None:
    obj = want()
    observed = {"h100-0-gpu.fakefleet.dev": facts_of(obj, {2: devices.unhealthy_taint("Xid79")})}
    assert devices.plan(CLUSTER, [obj], observed) == []


def test_a_changed_pool_or_another_owner_publishes_again() -> None:
    obj = want()
    observed = {"h100-0-gpu.fakefleet.dev": facts_of(obj)}
    assert devices.plan(CLUSTER, [want(driverVersion="580.65.6")], observed) == [
        Publish("h100-0")]
    assert devices.plan(CLUSTER, [want(uid="made-again")], observed) == [Publish("h100-0")]


def test_slices_of_nodes_gone_or_no_longer_publishing_are_withdrawn_first() -> None:
    kept, gone = want("h100-0"), want("h100-1", uid="uid-2")
    observed = {"h100-1-gpu.fakefleet.dev": facts_of(gone, uid="s-1"),
                "stray": facts_of(kept, name="stray", uid="s-2")}
    assert devices.plan(CLUSTER, [kept], observed) == [
        Withdraw("h100-1-gpu.fakefleet.dev", "s-1"), Withdraw("stray", "s-2"), Publish("h100-0")]


def test_an_engine_alone_takes_a_dra_pool_on_its_command_line() -> None:
    import argparse

    from operators.engine.__main__ import parse_pool
    name, pool = parse_pool("h100=3:H100-SXM5-80GB:dra", "1s")
    assert (name, pool.replicas, pool.publishes_devices) == ("h100", 3, True)
    assert not parse_pool("h100=3:H100-SXM5-80GB", "1s")[1].publishes_devices
    for bad, fragment in (("h=1::dra", "NAME=REPLICAS:GPU_PRESET:ALLOCATION"),
                          ("h=1:H100-SXM5-80GB:mig", "gpu.allocation")):
        with pytest.raises(argparse.ArgumentTypeError, match=fragment):
            parse_pool(bad, "1s")
