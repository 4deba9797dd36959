"""A tool's main package with files of fakefleet's added, laid out as a wrapper module: pure
rendering, and the one function that writes it.

``go install`` builds a package as its module ships it, and Go lays no file over its module
cache (``-overlay`` refuses files beneath GOMODCACHE). A tool whose main package needs a few
lines of ours (KubeRay's webhook server, whose address upstream fixes) is built from a module
of our own instead: the main package's files copied from the module source unchanged, ours
beside them, upstream's go.mod under the wrapper's module path with the tool's module itself
required, and upstream's go.sum with that module's two lines (which ``go mod download`` gives).
Nothing is resolved anew: the build uses the versions upstream's go.mod lists.

Only for modules whose go.mod replaces and excludes nothing: those directives would have to be
carried over, as the Kubernetes build does (:mod:`operators.controlplane.building`).
:mod:`operators.controlplane.tools` runs the build.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

from operators.controlplane.errors import BuildError
from operators.controlplane.modules import Module

#: The wrapper's module path: never published, so no import can mean another module.
WRAPPER_MODULE = "fakefleet.dev/wrapped"

_MODULE_RE = re.compile(r"^module\s+\S+\s*$", re.MULTILINE)
_DIRECTIVE_RE = re.compile(r"^\s*(replace|exclude)\b", re.MULTILINE)


def render_gomod(upstream: str, *, module: str, version: str) -> str:
    """The wrapper's go.mod: upstream's, under :data:`WRAPPER_MODULE`, requiring
    ``module@version`` itself."""
    directive = _DIRECTIVE_RE.search(upstream)
    if directive is not None:
        raise BuildError(f"the go.mod of {module}@{version} has a {directive.group(1)} "
                         f"directive, which a wrapper module does not carry over: build it "
                         f"with a wrapper of its own, as the Kubernetes build does")
    text, found = _MODULE_RE.subn(f"module {WRAPPER_MODULE}", upstream, count=1)
    if not found:
        raise BuildError(f"the go.mod of {module}@{version} has no module directive")
    return f"{text.rstrip()}\n\nrequire {module} {version}\n"


def render_gosum(upstream: str, *, module: str, version: str, sums: tuple[str, str]) -> str:
    """The wrapper's go.sum: upstream's, and the hashes (tree, go.mod) of ``module@version``."""
    tree, gomod = sums
    if not tree or not gomod:
        raise BuildError(f"go mod download gave no hashes of {module}@{version}")
    return f"{upstream.rstrip()}\n{module} {version} {tree}\n{module} {version}/go.mod {gomod}\n"


def package_dir(module: str, package: str) -> str:
    """The main package's directory in its module (``""``: the module's root)."""
    if package == module:
        return ""
    if not package.startswith(module + "/"):
        raise BuildError(f"the package {package} is not in the module {module}")
    return package.removeprefix(module + "/")


def main_files(directory: Path) -> list[Path]:
    """The main package's files as upstream ships them (its tests left out)."""
    return sorted(path for path in directory.glob("*.go") if not path.name.endswith("_test.go"))


def write(directory: Path, source: Module, *, module: str, package: str, version: str,
          additions: Sequence[Path]) -> None:
    """Lay the wrapper module out in ``directory`` (which exists and is empty)."""
    upstream = source.source / package_dir(module, package)
    files = main_files(upstream)
    if not files:
        raise BuildError(f"{package}@{version} has no Go files in {upstream}")
    for path in [*files, *additions]:
        if (directory / path.name).exists():
            raise BuildError(f"{path.name} is both upstream's and fakefleet's in {package}")
        shutil.copyfile(path, directory / path.name)
    (directory / "go.mod").write_text(render_gomod(source.gomod.read_text(), module=module,
                                                   version=version))
    (directory / "go.sum").write_text(render_gosum(
        (source.source / "go.sum").read_text(), module=module, version=version,
        sums=(source.sum, source.gomod_sum)))
