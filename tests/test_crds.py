"""The generated CRDs are structural and match what is committed under crds/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from operators.api import RESOURCES
from operators.api.crdgen import crd, file_name, render

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


def test_status_has_no_defaults() -> None:
    for model in RESOURCES:
        status = crd(model)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
            "status"]
        assert not any("default" in node for node in walk(status))
