"""The AI-conformance report without a cluster: the checklist as data, PRODUCT.yaml and
junit.xml as the writer makes them, and the offline validator against upstream's rules (field
names, sections, levels and the status enum, as facts of upstream's checklist and validator)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from operators.api.clusters import FakeCluster
from operators.api.nodepools import FakeNodePool
from operators.cli import main
from operators.conformance import checklists, reporting, validating
from operators.conformance.checking import Evidence
from operators.conformance.checks import AUTOMATABLE_MUSTS, CHECKS
from operators.conformance.checks.stated import STATED
from operators.conformance.results import STATUSES, Result

# Facts of upstream's checklist v1.36 and its validator: ids by section and level, the enum.
V136 = {
    "accelerators": {"driver_runtime_management": "SHOULD", "gpu_sharing": "SHOULD",
                     "virtualized_accelerator": "SHOULD"},
    "networking": {"ai_inference": "MUST", "advanced_inference_ingress": "SHOULD",
                   "high_performance_networking": "SHOULD",
                   "disaggregated_inference": "SHOULD"},
    "schedulingOrchestration": {"gang_scheduling": "MUST", "cluster_autoscaling": "MUST",
                                "pod_autoscaling": "MUST"},
    "observability": {"accelerator_metrics": "MUST", "ai_service_metrics": "MUST"},
    "security": {"secure_accelerator_access": "MUST"},
    "operator": {"robust_controller": "MUST"},
}
UPSTREAM_STATUSES = {"Implemented", "Not Implemented", "Partially Implemented", "N/A"}
UPSTREAM_METADATA = {"kubernetesVersion", "platformName", "platformVersion", "vendorName",
                     "websiteUrl", "repoUrl", "documentationUrl", "productLogoUrl",
                     "description", "contactEmailAddress", "k8sConformanceUrl"}


def test_the_v1_36_checklist_is_upstream_s_ids_sections_and_levels() -> None:
    checklist = checklists.load("v1.36")
    assert checklist.version == "v1.36"
    found: dict[str, dict[str, str]] = {}
    for requirement in checklist.requirements:
        found.setdefault(requirement.section, {})[requirement.id] = requirement.level
    assert found == V136
    assert list(found) == list(checklists.SECTIONS)
    assert "dra_support" not in checklist.ids
    assert set(STATUSES) == UPSTREAM_STATUSES
    assert set(reporting.METADATA_FIELDS) == UPSTREAM_METADATA
    # Every requirement is either checked or stated, and the automatable MUSTs are checked.
    assert set(checklist.ids) == set(CHECKS) | set(STATED)
    assert set(AUTOMATABLE_MUSTS) <= set(CHECKS)
    assert {checklist.requirement(id).level for id in AUTOMATABLE_MUSTS} == {"MUST"}


def test_an_unknown_version_names_the_versions_there_are() -> None:
    with pytest.raises(checklists.UnknownVersion, match=r"'v1\.99'.*give --version one of "
                                                        r"v1\.36"):
        checklists.load("v1.99")


def test_a_checklist_with_a_bad_level_or_section_is_refused() -> None:
    item = {"section": "networking", "id": "x", "level": "MAY", "description": "d"}
    with pytest.raises(ValueError, match=r"requirements\[0\]\.level 'MAY'"):
        checklists.parse({"version": "v0", "requirements": [item]})
    with pytest.raises(ValueError, match=r"section 'net' is not one of"):
        checklists.parse({"version": "v0", "requirements": [{**item, "level": "MUST",
                                                             "section": "net"}]})


def test_metadata_without_flags_is_fakefleet_the_cluster_s_version_and_placeholders() -> None:
    meta = reporting.metadata({}, kubernetes_version="v1.36.3", platform_version="0.1.0")
    assert list(meta) == list(reporting.METADATA_FIELDS)
    assert meta["kubernetesVersion"] == "v1.36"
    assert (meta["platformName"], meta["platformVersion"]) == ("fakefleet", "0.1.0")
    for field in UPSTREAM_METADATA - {"kubernetesVersion", "platformName", "platformVersion"}:
        assert meta[field] == "[placeholder]", field
    given = reporting.metadata({"vendorName": "Example"}, kubernetes_version="v1.36.3",
                               platform_version="0.1.0")
    assert given["vendorName"] == "Example"
    with pytest.raises(ValueError, match="vendor are not the program's: give any of"):
        reporting.metadata({"vendor": "x"}, kubernetes_version="v1.36.3",
                           platform_version="0.1.0")


def results(tmp: Path) -> list[Result]:
    """A run's results: gang with an evidence file, cluster autoscaling past its deadline,
    the stated ones, and DRA as an extra."""
    evidence = Evidence(tmp, "gang_scheduling")
    evidence.write("jobs.yaml", {"items": []})
    found = [Result("gang_scheduling", "Implemented", "admitted whole",
                    tuple(evidence.files), 12.5),
             Result("cluster_autoscaling", "Not Implemented", "deadline passed", (), 300.0,
                    deadline="300s, waiting for a node")]
    found += [Result(id, status, why, automated=False) for id, (status, why) in STATED.items()]
    found.append(Result("dra_resource_claims", "Implemented", "allocated", extra=True))
    return found


def test_product_yaml_has_every_requirement_in_its_section_and_the_banner(
        tmp_path: Path) -> None:
    checklist = checklists.load()
    found = results(tmp_path)
    meta = reporting.metadata({}, kubernetes_version="v1.36.3", platform_version="0.1.0")
    document = reporting.product(checklist, meta, {r.id: r for r in found if not r.extra})
    text = reporting.product_yaml(document, checklist, validating.by_design(document,
                                                                            checklist))
    assert text.startswith("# Kubernetes AI Conformance checklist v1.36")
    assert "not a certification" in text.splitlines()[1]
    loaded = yaml.safe_load(text)
    assert set(loaded) == {"metadata", "spec"}
    assert list(loaded["spec"]) == list(checklists.SECTIONS)
    items = {i["id"]: i for section in loaded["spec"].values() for i in section}
    assert set(items) == set(checklist.ids), "DRA is no requirement of v1.36"
    for item in items.values():
        assert list(item) == ["id", "description", "level", "status", "evidence", "notes"]
        assert item["notes"].endswith(reporting.NOTE_SUFFIX)
    assert items["gang_scheduling"]["evidence"] == ["evidence/gang_scheduling/jobs.yaml"]
    assert items["pod_autoscaling"]["status"] == "Not Implemented"
    assert items["pod_autoscaling"]["notes"].startswith("no check ran")
    assert items["secure_accelerator_access"]["status"] == "Not Implemented"
    assert validating.validate(loaded, checklist, tmp_path) == []


def test_junit_has_a_case_per_requirement_failures_skips_and_the_deadline(
        tmp_path: Path) -> None:
    checklist = checklists.load()
    found = results(tmp_path)
    suite = ET.fromstring(reporting.junit(checklist, found))
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {r.id for r in found}
    assert suite.get("tests") == str(len(found))
    assert cases["gang_scheduling"].find("failure") is None
    assert cases["gang_scheduling"].get("classname") == "schedulingOrchestration"
    failure = cases["cluster_autoscaling"].find("failure")
    assert failure is not None
    assert "deadline passed: 300s, waiting for a node" in (failure.text or "")
    assert cases["virtualized_accelerator"].find("skipped") is not None
    assert cases["dra_resource_claims"].get("classname") == "extra"
    assert suite.get("failures") == "1"
    rows = reporting.table(checklist, found)
    assert [r.requirement for r in rows][-1] == "dra_resource_claims"
    assert rows[-1].level == "extra"
    by_id = {r.requirement: r for r in rows}
    assert by_id["gang_scheduling"].automated
    assert not by_id["secure_accelerator_access"].automated, "stated: no time to show"


def upstream_shaped(tmp: Path) -> dict[str, Any]:
    """A submission in upstream's shape (as a v1.36 PRODUCT.yaml is): URLs and a local file
    as evidence."""
    (tmp / "results").mkdir()
    (tmp / "results" / "junit.xml").write_text("<testsuite/>")
    spec: dict[str, list[dict[str, Any]]] = {}
    for section, ids in V136.items():
        spec[section] = [{"id": id, "description": "d", "level": level, "status": "Implemented",
                          "evidence": ["https://docs.example.com/x", "results/junit.xml"],
                          "notes": ""} for id, level in ids.items()]
    meta = {field: "https://example.com/logo.svg" for field in UPSTREAM_METADATA}
    return {"metadata": meta, "spec": spec}


def test_the_validator_passes_an_upstream_shaped_file_and_names_each_broken_rule(
        tmp_path: Path) -> None:
    checklist = checklists.load()
    document = upstream_shaped(tmp_path)
    assert validating.validate(document, checklist, tmp_path) == []
    spec = document["spec"]
    spec["operator"] = []
    spec["security"][0]["status"] = "Done"
    spec["accelerators"][0].update(status="N/A", notes="")
    spec["networking"][0]["evidence"] = ["evidence/ai_inference/missing.yaml"]
    del spec["observability"]
    del document["metadata"]["vendorName"]
    errors = validating.validate(document, checklist, tmp_path)
    assert errors == [
        "Missing metadata field: vendorName",
        "Notes required for 'driver_runtime_management' when status is N/A",
        f"Invalid evidence file for 'ai_inference': evidence/ai_inference/missing.yaml (not "
        f"found at {tmp_path}/evidence/ai_inference/missing.yaml)",
        "Missing spec category: observability",
        "Missing spec category: observability",
        "Invalid status 'Done' for 'secure_accelerator_access'. Must be one of "
        "['Implemented', 'Not Implemented', 'Partially Implemented', 'N/A']",
        "Missing requirement 'robust_controller' in category 'operator'",
    ]


def test_by_design_lists_musts_not_implemented_placeholders_and_the_network_checks() -> None:
    checklist = checklists.load()
    meta = reporting.metadata({}, kubernetes_version="v1.36.3", platform_version="0.1.0")
    document = reporting.product(checklist, meta, {})
    failing = validating.by_design(document, checklist)
    musts = [id for id in checklist.ids if checklist.requirement(id).level == "MUST"]
    assert [f for f in failing if f.startswith("MUST")] == [
        f"MUST '{id}' is 'Not Implemented', not Implemented" for id in musts]
    assert any(f.startswith("placeholder metadata") and "vendorName" in f for f in failing)
    assert "CNCF member" in failing[-1]




def test_the_example_cluster_is_valid_and_has_what_the_checks_on_main_need() -> None:
    docs = list(yaml.safe_load_all((Path(__file__).parent.parent / "examples" / "conformance"
                                    / "cluster.yaml").read_text()))
    cluster = FakeCluster.model_validate(docs[0])
    assert cluster.spec.kueue is not None
    assert cluster.spec.karpenter is not None
    pools = [FakeNodePool.model_validate(doc) for doc in docs[1:]]
    assert {p.spec.clusterRef for p in pools} == {cluster.metadata["name"]}
    assert any(p.spec.provisioner and p.spec.gpu for p in pools), "cluster_autoscaling's pool"
    assert any(p.spec.gpu and p.spec.gpu.allocation == "dra" for p in pools), "DRA's"


@pytest.mark.parametrize(("args", "said"), [
    (["--version", "v1.99"], "no AI-conformance checklist 'v1.99' in this build of fakefleet: "
                             "give --version one of v1.36"),
    (["--set", "vendor=x"], "metadata field(s) vendor are not the program's: give any of "
                            "kubernetesVersion,"),
    (["--set", "vendorName"], "--set 'vendorName': give FIELD=VALUE"),
    (["--only", "gang"], "--only names gang, which checklist v1.36 does not have"),
])
def test_the_command_refuses_what_it_cannot_run_before_it_starts(
        tmp_path: Path, args: list[str], said: str) -> None:
    done = CliRunner().invoke(main, ["conformance", "run", "--cluster", "c", "-o",
                                     str(tmp_path / "out"), "--state-dir",
                                     str(tmp_path / "none"), *args])
    assert done.exit_code == 2, done.output
    assert said in done.output
    assert not (tmp_path / "out").exists()
