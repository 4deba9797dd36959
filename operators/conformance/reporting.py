"""PRODUCT.yaml, junit.xml and the table, from a checklist, the metadata and the results:
pure, apart from :func:`write`, which puts the two files in the output directory.

PRODUCT.yaml has the program's submission shape: ``metadata`` with its eleven fields and
``spec`` with the six sections, each a list of ``{id, description, level, status, evidence,
notes}`` in the checklist's order. A check that is no requirement of the checklist (DRA in
v1.36) goes to junit.xml only.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from operators.conformance.checklists import SECTIONS, Checklist
from operators.conformance.results import BANNER, Result

#: The metadata fields of a submission, in the template's order.
METADATA_FIELDS = ("kubernetesVersion", "platformName", "platformVersion", "vendorName",
                   "websiteUrl", "repoUrl", "documentationUrl", "productLogoUrl",
                   "description", "contactEmailAddress", "k8sConformanceUrl")
#: What fakefleet writes for a field nobody gave: it never invents a vendor.
PLACEHOLDER = "[placeholder]"
#: Appended to every requirement's notes.
NOTE_SUFFIX = "(fakefleet rehearsal on simulated hardware, not a certification)"


def metadata(given: Mapping[str, str], *, kubernetes_version: str,
             platform_version: str) -> dict[str, str]:
    """The submission's metadata: what was given, else fakefleet as the platform, the
    cluster's Kubernetes minor version, and a placeholder for every vendor field.

    A field that is not the program's is refused, naming those that are."""
    refusal = unknown_fields(given)
    if refusal:
        raise ValueError(refusal)
    defaults = {"kubernetesVersion": minor(kubernetes_version), "platformName": "fakefleet",
                "platformVersion": platform_version}
    return {field: given.get(field) or defaults.get(field, PLACEHOLDER)
            for field in METADATA_FIELDS}


def unknown_fields(given: Mapping[str, str]) -> str:
    """Why ``given`` cannot be a submission's metadata, or "" when it can."""
    unknown = sorted(set(given) - set(METADATA_FIELDS))
    return (f"metadata field(s) {', '.join(unknown)} are not the program's: give any of "
            f"{', '.join(METADATA_FIELDS)}") if unknown else ""


def minor(version: str) -> str:
    """v1.36 of v1.36.3, as submissions name the Kubernetes version."""
    parts = version.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else version


def product(checklist: Checklist, meta: Mapping[str, str],
            results: Mapping[str, Result]) -> dict[str, Any]:
    """The PRODUCT.yaml document; every requirement of the checklist is in it, a requirement
    without a result (none can be) as Not Implemented saying so."""
    spec: dict[str, list[dict[str, Any]]] = {section: [] for section in SECTIONS}
    for requirement in checklist.requirements:
        result = results.get(requirement.id)
        status = result.status if result else "Not Implemented"
        notes = result.notes if result else "no check ran for this requirement"
        spec[requirement.section].append({
            "id": requirement.id,
            "description": requirement.description,
            "level": requirement.level,
            "status": status,
            "evidence": list(result.evidence) if result else [],
            "notes": f"{notes} {NOTE_SUFFIX}",
        })
    return {"metadata": dict(meta), "spec": spec}


def product_yaml(document: Mapping[str, Any], checklist: Checklist,
                 by_design: Sequence[str]) -> str:
    """The document as YAML, under a header that says what it is and which of upstream's rules
    it fails by design."""
    header = [f"# Kubernetes AI Conformance checklist {checklist.version}, filled in by "
              f"fakefleet conformance run.", f"# {BANNER}."]
    if by_design:
        header.append("# Upstream's validator (scripts/validate.go) fails this file by design:")
        header.extend(f"#   - {rule}" for rule in by_design)
    body = yaml.safe_dump(dict(document), sort_keys=False, allow_unicode=True, width=100)
    return "\n".join(header) + "\n\n" + body


def junit(checklist: Checklist, results: Sequence[Result]) -> str:
    """junit.xml: one test case per requirement (and per extra check). Implemented passes; a
    check that ran and found less fails; what fakefleet only states (N/A, or Not Implemented
    because simulation cannot judge it) is skipped with its notes."""
    suite = ET.Element("testsuite", {
        "name": f"fakefleet AI conformance {checklist.version}",
        "tests": str(len(results)),
        "failures": str(sum(1 for r in results if _fails(r))),
        "skipped": str(sum(1 for r in results if _skipped(r))),
        "time": f"{sum(r.seconds for r in results):.3f}"})
    ET.SubElement(ET.SubElement(suite, "properties"), "property",
                  {"name": "banner", "value": BANNER})
    sections = {r.id: r.section for r in checklist.requirements}
    for result in results:
        case = ET.SubElement(suite, "testcase", {
            "classname": sections.get(result.id, "extra"), "name": result.id,
            "time": f"{result.seconds:.3f}"})
        message = result.notes if not result.deadline else \
            f"{result.notes} (deadline passed: {result.deadline})"
        if _fails(result):
            ET.SubElement(case, "failure", {"message": result.status}).text = message
        elif _skipped(result):
            ET.SubElement(case, "skipped", {"message": f"{result.status}: {message}"})
        if result.evidence:
            ET.SubElement(case, "system-out").text = "\n".join(result.evidence)
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, "unicode") + "\n"


def _fails(result: Result) -> bool:
    return result.automated and not result.passed and result.status != "N/A"


def _skipped(result: Result) -> bool:
    return not result.passed and not _fails(result)


@dataclasses.dataclass(frozen=True)
class Row:
    """One line of the table a run prints."""

    requirement: str
    level: str
    status: str
    seconds: float
    deadline: str
    automated: bool


def table(checklist: Checklist, results: Sequence[Result]) -> list[Row]:
    """The checklist's requirements in order, then the extra checks."""
    levels = {r.id: r.level for r in checklist.requirements}
    order = {id: index for index, id in enumerate(checklist.ids)}
    ranked = sorted(results, key=lambda r: order.get(r.id, len(order)))
    return [Row(r.id, levels.get(r.id, "extra"), r.status, r.seconds, r.deadline, r.automated)
            for r in ranked]


def write(directory: Path, product_text: str, junit_text: str) -> None:
    """DIR/PRODUCT.yaml and DIR/junit.xml (the evidence is written as the checks run)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "PRODUCT.yaml").write_text(product_text)
    (directory / "junit.xml").write_text(junit_text)
