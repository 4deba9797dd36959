"""The offline subset of upstream's validator (cncf/k8s-ai-conformance scripts/validate.go),
and the rules of it that a file fakefleet writes fails by design: pure, apart from looking
whether evidence files exist.

Offline, as upstream checks them: every section and every requirement of the checklist
present; every status one of the four; N/A only with notes; every local evidence file there.
By design (:func:`by_design`): MUSTs that are not Implemented, metadata left as a placeholder
(``[...]``), and what needs the network (URLs answering, the k8s-conformance URL, the vendor a
CNCF member in the landscape).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from operators.conformance.checklists import Checklist
from operators.conformance.results import STATUSES

#: upstream's required metadata fields (repoUrl is optional there).
REQUIRED_METADATA = ("kubernetesVersion", "platformName", "platformVersion", "vendorName",
                     "websiteUrl", "documentationUrl", "productLogoUrl", "description",
                     "contactEmailAddress", "k8sConformanceUrl")


def validate(document: Mapping[str, Any], checklist: Checklist, base: Path) -> list[str]:
    """What upstream's validator would refuse offline; empty when nothing. ``base``: the
    directory of the PRODUCT.yaml, which local evidence is relative to."""
    errors: list[str] = []
    meta = document.get("metadata")
    if not isinstance(meta, Mapping):
        errors.append("Missing 'metadata' section")
    else:
        for field in REQUIRED_METADATA:
            value = meta.get(field)
            if value is None:
                errors.append(f"Missing metadata field: {field}")
            elif not isinstance(value, str):
                errors.append(f"Metadata field {field} is not a string")
            elif not value:
                errors.append(f"Metadata field {field} is empty")
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        return [*errors, "Missing 'spec' section"]
    for requirement in checklist.requirements:
        items = spec.get(requirement.section)
        if not isinstance(items, list):
            errors.append(f"Missing spec category: {requirement.section}")
            continue
        found = {item.get("id"): item for item in items if isinstance(item, Mapping)}
        item = found.get(requirement.id)
        if item is None:
            errors.append(f"Missing requirement '{requirement.id}' in category "
                          f"'{requirement.section}'")
            continue
        status = item.get("status")
        if status not in STATUSES:
            errors.append(f"Invalid status '{status}' for '{requirement.id}'. Must be one of "
                          f"{list(STATUSES)}")
        if status == "N/A" and not item.get("notes"):
            errors.append(f"Notes required for '{requirement.id}' when status is N/A")
        for link in item.get("evidence") or []:
            if not link or str(link).startswith(("http://", "https://")):
                continue
            if not (base / str(link)).exists():
                errors.append(f"Invalid evidence file for '{requirement.id}': {link} (not "
                              f"found at {base / str(link)})")
    return errors


def by_design(document: Mapping[str, Any], checklist: Checklist) -> list[str]:
    """The rules of upstream's validator this file fails, and why each is expected of a
    rehearsal."""
    failing: list[str] = []
    spec = document.get("spec") or {}
    for requirement in checklist.requirements:
        if requirement.level != "MUST":
            continue
        item: Mapping[str, Any] = next((i for i in spec.get(requirement.section) or []
                     if i.get("id") == requirement.id), {})
        if item.get("status") != "Implemented":
            failing.append(f"MUST '{requirement.id}' is '{item.get('status')}', not "
                           f"Implemented")
    meta = document.get("metadata") or {}
    placeholders = [field for field, value in meta.items()
                    if isinstance(value, str) and value.startswith("[") and value.endswith("]")]
    if placeholders:
        failing.append(f"placeholder metadata (fakefleet never invents a vendor): "
                       f"{', '.join(placeholders)}")
    failing.append("not checked offline, needs the network: metadata URLs and http(s) evidence "
                   "answering, k8sConformanceUrl naming a cncf/k8s-conformance submission, "
                   "vendorName a CNCF member in the landscape")
    return failing
