"""The generated CRDs are structural and match what is committed under crds/; what their
patterns accept."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from pydantic import ValidationError

from operators.api import RESOURCES, CustomResource, FakeCluster, FakeClusterSpec, FakeNodePool
from operators.api.clusters import MAX_CLUSTER_NAME_LENGTH, FederationSpec
from operators.api.crdgen import crd, file_name, render
from operators.api.nodepools import (
    INSTANCE_TYPE_PREFIX,
    MAX_NODES_PER_CLUSTER,
    MAX_POOL_NAME_LENGTH,
    node_name,
)
from operators.api.replays import Replay, speed_factor

CRDS = Path(__file__).parent.parent / "crds"


def walk(node: Any) -> Any:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def test_committed_crds_are_current() -> None:
    for model in RESOURCES:
        assert (CRDS / file_name(model)).read_text() == render(model), (
            "crds/ is stale: run 'make generate'")


def test_schemas_are_structural() -> None:
    for model in RESOURCES:
        schema = crd(model)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for node in walk(schema):
            assert "$ref" not in node
            assert "title" not in node
            assert node.get("additionalProperties") is not False
            assert {"type": "null"} not in node.get("anyOf", [])


def test_kubectl_niceties() -> None:
    pools = yaml.safe_load((CRDS / "fakefleet.dev_fakenodepools.yaml").read_text())
    version = pools["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"
    assert pools["spec"]["names"]["shortNames"] == ["fnp"]
    assert pools["spec"]["names"]["categories"] == ["fakefleet"]
    clusters = yaml.safe_load((CRDS / "fakefleet.dev_fakeclusters.yaml").read_text())
    columns = [c["name"] for c in clusters["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:2] == ["Phase", "Nodes"]


def test_status_defaults_to_unobserved_and_to_nothing_else() -> None:
    """An object no controller has looked at reads as observedGeneration 0 (kstatus:
    InProgress, not Current); nothing the operator observes is ever defaulted."""
    for model in RESOURCES:
        status = crd(model)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
            "status"]
        assert status["default"] == {"observedGeneration": 0}
        assert not any("default" in node for node in walk(status["properties"]))


def schema_of(model: type[CustomResource]) -> dict[str, Any]:
    schema: dict[str, Any] = crd(model)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_names_are_bounded_at_the_root_so_derived_names_stay_valid() -> None:
    assert MAX_CLUSTER_NAME_LENGTH == 63  # the cluster's name is a label value
    # The longest pool name still makes label values of its longest node name and instance type.
    pool = "p" * MAX_POOL_NAME_LENGTH
    assert len(node_name(pool, MAX_NODES_PER_CLUSTER - 1)) <= 63
    assert len(INSTANCE_TYPE_PREFIX + pool) <= 63
    assert MAX_POOL_NAME_LENGTH == 53
    for model, limit in ((FakeCluster, MAX_CLUSTER_NAME_LENGTH),
                         (FakeNodePool, MAX_POOL_NAME_LENGTH)):
        rule = schema_of(model)["x-kubernetes-validations"][0]  # FakeCluster has more after it
        assert rule["rule"] == f"size(self.metadata.name) <= {limit}"
        assert f"at most {limit} characters" in rule["message"]
        assert rule["fieldPath"] == ".metadata.name"


def test_replicas_fit_the_pod_cidrs() -> None:
    assert MAX_NODES_PER_CLUSTER == 2 ** (24 - 9)  # /24 slices of 10.128.0.0/9
    replicas = schema_of(FakeNodePool)["properties"]["spec"]["properties"]["replicas"]
    assert replicas["maximum"] == MAX_NODES_PER_CLUSTER
    assert str(MAX_NODES_PER_CLUSTER) in replicas["description"]


def test_cluster_ref_is_selectable() -> None:
    version = crd(FakeNodePool)["spec"]["versions"][0]
    assert version["selectableFields"] == [{"jsonPath": ".spec.clusterRef"}]
    assert "selectableFields" not in crd(FakeCluster)["spec"]["versions"][0]


def bounded_paths(schema: Any, path: str = "", bounded: bool = True) -> Iterator[tuple[str, bool]]:
    """Every schema node with a CEL rule, and whether it and every list or map it sits in is
    bounded (what the API server's cost estimate needs)."""
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind == "string" or "x-kubernetes-int-or-string" in schema:
        bounded = bounded and "maxLength" in schema
    elif kind == "array":
        bounded = bounded and "maxItems" in schema
    elif kind == "object" and "additionalProperties" in schema:
        bounded = bounded and "maxProperties" in schema
    rules = schema.get("x-kubernetes-validations", [])
    if any(rule["rule"] != "self == oldSelf" for rule in rules) and path:
        yield path, bounded
    for name, child in schema.get("properties", {}).items():
        yield from bounded_paths(child, f"{path}.{name}", bounded)
    yield from bounded_paths(schema.get("items"), f"{path}[]", bounded)
    yield from bounded_paths(schema.get("additionalProperties"), f"{path}{{}}", bounded)


def test_every_string_list_and_map_under_a_rule_is_bounded() -> None:
    for model in RESOURCES:
        spec = schema_of(model)["properties"]["spec"]
        unbounded = [path for path, bounded in bounded_paths(spec, "spec") if not bounded]
        assert not unbounded, f"{model.__name__}: give these maxLength/maxItems/maxProperties"


@pytest.mark.parametrize("address", ["hub.example.com:7443", "127.0.0.1:1", "[::1]:65535",
                                     "hub:443", "a-b.c-d.example:8080"])
def test_a_hub_address_is_host_and_port(address: str) -> None:
    assert FederationSpec(address=address, credentialsSecret="hub").address == address


@pytest.mark.parametrize("address", ["hub.example.com", "hub:0", "hub:65536", ":7443",
                                     "https://hub:7443", "hub:7443/path", "-hub:7443"])
def test_a_hub_address_without_a_port_or_with_more_is_refused(address: str) -> None:
    with pytest.raises(ValidationError, match="address"):
        FederationSpec(address=address, credentialsSecret="hub")


def test_a_cluster_without_federation_joins_the_hub_of_its_host() -> None:
    assert FakeClusterSpec().effective_federation == FederationSpec()
    assert FakeClusterSpec().effective_federation.joins_local_hub
    assert not FederationSpec(enabled=False).joins_local_hub
    remote = FederationSpec(address="hub:7443", credentialsSecret="hub-member")
    assert not remote.joins_local_hub
    assert FakeClusterSpec(federation=remote).effective_federation == remote


def test_federation_address_and_credentials_go_together() -> None:
    federation = schema_of(FakeCluster)["properties"]["spec"]["properties"]["federation"]
    rules = {rule["fieldPath"]: rule for rule in federation["x-kubernetes-validations"]}
    assert rules[".credentialsSecret"]["rule"] == \
        "!has(self.address) || has(self.credentialsSecret)"
    assert rules[".address"]["rule"] == "!has(self.credentialsSecret) || has(self.address)"
    assert "default" not in federation, "absent means the host's hub, not a stored default"


# -- Replay ---------------------------------------------------------------------------------

def replay_spec() -> dict[str, Any]:
    spec: dict[str, Any] = schema_of(Replay)["properties"]["spec"]
    return spec


def cel_holds(rule: str, value: Any) -> bool:
    """``rule`` as the API server evaluates it on ``value`` (celpy, the CEL the FaultPlan
    expectations use; these rules use nothing Kubernetes adds to CEL)."""
    environment = celpy.Environment()
    return bool(environment.program(environment.compile(rule)).evaluate(
        {"self": json_to_cel(value)}))


@pytest.mark.parametrize(("speed", "accepted"), [
    (1, True), (10, True), (1_000_000, True), ("max", True), ("0.5", True), ("0.001", True),
    ("2.25", True), (0, False), (1_000_001, False), ("0", False), ("0.0001", False),
    ("1000000.5", False),
])
def test_a_replay_speed_is_a_bounded_factor_or_max(speed: Any, accepted: bool) -> None:
    field = replay_spec()["properties"]["speed"]
    assert field["x-kubernetes-int-or-string"] is True
    pattern = re.compile(field["pattern"])
    matches = isinstance(speed, int) or bool(pattern.fullmatch(speed))
    (rule,) = field["x-kubernetes-validations"]
    assert (matches and cel_holds(rule["rule"], speed)) == accepted
    assert "speed must be a factor from 0.001 to 1000000" in rule["message"]
    assert "or max" in rule["message"]
    if accepted:
        assert speed_factor(speed) == (0.0 if speed == "max" else float(speed))
    else:
        with pytest.raises(ValueError, match="speed must be a factor"):
            speed_factor(speed)


@pytest.mark.parametrize("speed", ["fast", "1e3", "-1", "1/2", "max ", "12345678"])
def test_a_replay_speed_that_is_no_number_is_refused_by_its_pattern(speed: str) -> None:
    assert not re.fullmatch(replay_spec()["properties"]["speed"]["pattern"], speed)


def test_a_replay_names_its_cluster_and_trace_and_is_immutable() -> None:
    spec = replay_spec()
    assert spec["required"] == ["clusterRef", "trace"]
    assert spec["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    assert "delete the Replay and apply it again" in spec["x-kubernetes-validations"][0][
        "message"]
    reference = spec["properties"]["trace"]["properties"]["configMapRef"]
    assert reference["required"] == ["name", "key"]
    assert "1 MiB" in reference["description"]
    assert "trace.configMapRef.name must be the name of a ConfigMap" in reference[
        "properties"]["name"]["x-kubernetes-validations"][0]["message"]
    assert "from" in spec["properties"], "spec.from as the CLI's --from"
    assert spec["properties"]["clusterRef"]["maxLength"] == MAX_CLUSTER_NAME_LENGTH
    parsed = Replay.model_validate({"metadata": {"name": "r"}, "spec": {
        "clusterRef": "west", "from": "east",
        "trace": {"configMapRef": {"name": "t", "key": "trace"}}}})
    assert (parsed.spec.from_, parsed.spec.speed, parsed.spec.rawPods) == ("east", 1, False)
    version = crd(Replay)["spec"]["versions"][0]
    assert version["selectableFields"] == [{"jsonPath": ".spec.clusterRef"}]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Cluster", "Phase", "Progress", "Lag", "Refused", "Age"]


# -- FakeCluster's controlPlane.nodeMonitorGracePeriod ----------------------------------------

@pytest.mark.parametrize(("grace", "accepted"), [
    ("10s", True), ("20s", True), ("1m30s", True), ("10m", True), ("9s", False),
    ("9999ms", False), ("10m1s", False), ("1h", False),
])
def test_the_node_monitor_grace_period_is_bounded_with_a_message(grace: str,
                                                                  accepted: bool) -> None:
    control_plane = schema_of(FakeCluster)["properties"]["spec"]["properties"]["controlPlane"]
    field = control_plane["properties"]["nodeMonitorGracePeriod"]
    assert "default" not in field, "absent: the controller-manager's own default"
    assert re.fullmatch(field["pattern"], grace)
    (rule,) = field["x-kubernetes-validations"]
    assert cel_holds(rule["rule"], grace) == accepted
    assert "give a nodeMonitorGracePeriod from 10s to 10m" in rule["message"]
    assert "or remove it for the controller-manager's default of 50s" in rule["message"]


def test_the_node_monitor_grace_period_is_immutable_with_the_control_plane() -> None:
    control_plane = schema_of(FakeCluster)["properties"]["spec"]["properties"]["controlPlane"]
    assert any(check["rule"] == "self == oldSelf"
               for check in control_plane["x-kubernetes-validations"])
    assert FakeClusterSpec().controlPlane.node_grace is None
    spec = FakeClusterSpec.model_validate({"controlPlane": {"nodeMonitorGracePeriod": "1m30s"}})
    assert spec.controlPlane.node_grace == 90.0
