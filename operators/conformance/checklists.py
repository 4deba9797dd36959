"""The Kubernetes AI Conformance checklists, as data: one YAML file per version beside this
module, read and checked here. Pure apart from reading the package's own files.

Nothing here knows how a requirement is checked; :mod:`operators.conformance.checks` does.
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from typing import Literal, cast

import yaml

Level = Literal["MUST", "SHOULD"]
#: The sections of ``spec`` in a PRODUCT.yaml, in the checklist's order.
SECTIONS = ("accelerators", "networking", "schedulingOrchestration", "observability",
            "security", "operator")
DEFAULT_VERSION = "v1.36"


class UnknownVersion(ValueError):
    """A checklist version fakefleet has no data for."""


@dataclasses.dataclass(frozen=True)
class Requirement:
    """One item of a checklist."""

    section: str
    id: str
    level: Level
    description: str


@dataclasses.dataclass(frozen=True)
class Checklist:
    """A checklist version and its requirements, in order."""

    version: str
    source: str
    requirements: tuple[Requirement, ...]

    def requirement(self, id: str) -> Requirement:
        """The requirement ``id``; KeyError when the checklist has none."""
        for found in self.requirements:
            if found.id == id:
                return found
        raise KeyError(id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(r.id for r in self.requirements)


def versions() -> tuple[str, ...]:
    """Every checklist version fakefleet has, sorted."""
    folder = resources.files(__package__).joinpath("checklists")
    return tuple(sorted(entry.name.removesuffix(".yaml") for entry in folder.iterdir()
                        if entry.name.endswith(".yaml")))


def load(version: str = DEFAULT_VERSION) -> Checklist:
    """The checklist of ``version`` (e.g. v1.36); UnknownVersion names those there are."""
    known = versions()
    if version not in known:
        raise UnknownVersion(f"no AI-conformance checklist {version!r} in this build of "
                             f"fakefleet: give --version one of {', '.join(known)}")
    text = resources.files(__package__).joinpath("checklists", f"{version}.yaml").read_text()
    return parse(yaml.safe_load(text))


def parse(data: dict[str, object]) -> Checklist:
    """A checklist from its data; ValueError names what is wrong with it."""
    items = data.get("requirements")
    if not isinstance(items, list) or not items:
        raise ValueError("a checklist needs a non-empty list 'requirements'")
    found: list[Requirement] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"requirements[{index}] is not a mapping")
        level = item.get("level")
        if level not in ("MUST", "SHOULD"):
            raise ValueError(f"requirements[{index}].level {level!r} is not MUST or SHOULD")
        requirement = Requirement(section=str(item.get("section")), id=str(item.get("id")),
                                  level=cast(Level, level),
                                  description=str(item.get("description", "")))
        if requirement.section not in SECTIONS:
            raise ValueError(f"requirements[{index}].section {requirement.section!r} is not "
                             f"one of {', '.join(SECTIONS)}")
        if not requirement.description:
            raise ValueError(f"requirements[{index}] ({requirement.id}) has no description")
        found.append(requirement)
    ids = [r.id for r in found]
    if len(set(ids)) != len(ids):
        raise ValueError(f"a checklist names each requirement once: {ids}")
    return Checklist(version=str(data.get("version")), source=str(data.get("source", "")),
                     requirements=tuple(found))
