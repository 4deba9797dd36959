"""The wheel and the image hold every package, and no test fake.

The image is never built on this project's machines (no Docker engine), so a package left out
of ``packages.find`` or of the Dockerfile's COPY lines would only show on someone else's
cluster. This builds the real wheel from a copy of the sources and reads what is in it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
#: The top-level packages of the distribution.
PACKAGES = ("operators", "federation", "primitives")


def _packages_in_tree() -> set[str]:
    found = set()
    for top in PACKAGES:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def _top_level_packages() -> set[str]:
    return {path.name for path in ROOT.iterdir()
            if (path / "__init__.py").exists() and path.name not in ("tests", "e2e", "bench")}


def test_every_top_level_package_is_one_of_the_distribution() -> None:
    assert _top_level_packages() == set(PACKAGES)


def test_the_wheel_holds_every_package_and_its_data_and_no_test_fake(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for top in PACKAGES:
        shutil.copytree(ROOT / top, source / top,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"), str(source)],
                   check=True, cwd=tmp_path)
    [wheel] = (tmp_path / "dist").glob("fakefleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    shipped = {name.rsplit("/", 1)[0].replace("/", ".") for name in names
               if name.endswith("/__init__.py")}
    assert shipped == _packages_in_tree()
    assert "operators/engine/stages.yaml" in names
    assert "operators/addons/kuberay/fakefleet_webhook.go" in names  # what KubeRay is built with
    assert "operators/conformance/checklists/v1.36.yaml" in names
    adapter = "operators/addons/custommetrics/adapter"
    assert {f"{adapter}/{name}" for name in ("go.mod", "go.sum", "main.go", "provider.go")} \
        <= names, "the operator builds the custom-metrics adapter from its source"
    assert f"{adapter}/provider_test.go" not in names
    assert not any(name.startswith(("tests/", "e2e/", "bench/")) for name in names)


def test_the_image_installs_every_runtime_dependency_pinned() -> None:
    """constraints.txt ('make constraints') pins each of pyproject.toml's dependencies to one
    version that the dependency's own range allows; the Dockerfile installs with it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = Version(version)
    for dependency in map(Requirement, project["dependencies"]):
        pinned = pins.get(canonicalize_name(dependency.name))
        assert pinned is not None, f"{dependency.name} is not in constraints.txt: make constraints"
        assert dependency.specifier.contains(pinned, prereleases=True), (
            f"constraints.txt pins {dependency.name}=={pinned}, outside {dependency.specifier}: "
            f"make constraints")
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install [^\n]*", dockerfile)
    assert installs
    assert all("-c constraints.txt" in line for line in installs)


def test_the_image_copies_every_top_level_package() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = dockerfile.split("\nFROM ")
    for stage in stages:
        if "COPY operators" not in stage:
            continue
        copied = set(re.findall(r"^COPY (\w+) \./\1$", stage, re.MULTILINE))
        assert copied == set(PACKAGES), stage.splitlines()[0]
