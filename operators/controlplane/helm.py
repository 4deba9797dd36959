"""Helm v3, built with ``go install helm.sh/helm/v3/cmd/helm@vX`` into the per-user cache.

What ``make chart`` and the chart's tests run (``helm lint``, ``helm template``). Upstream's
release build stamps its version and the Kubernetes version its templates see by default
(``.Capabilities.KubeVersion``: the minor of the ``k8s.io/client-go`` it requires, major + 1 as
its Makefile computes it); so does this build, reading the client-go version from Helm's own
go.mod in the module cache, never typing it by hand. ``$FAKEFLEET_HELM`` names a binary to use
instead.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from operators.controlplane.compiling import Progress, Spawn, popen
from operators.controlplane.errors import BuildError
from operators.controlplane.modules import download, find_go
from operators.controlplane.tools import GoTool

HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.22.0"
OVERRIDE = "FAKEFLEET_HELM"

_CLIENT_GO_RE = re.compile(r"^\s*k8s\.io/client-go\s+v(\d+)\.(\d+)\.\d+", re.MULTILINE)


def tool(version: str = HELM_VERSION, ldflags: str = "") -> GoTool:
    return GoTool(name="helm", title="Helm", package=f"{HELM_MODULE}/cmd/helm",
                  version=version, override=OVERRIDE, ldflags=ldflags)


def find(version: str = HELM_VERSION, root: Path | None = None) -> Path | None:
    """``$FAKEFLEET_HELM``, else the cached build, else None (nothing is built here)."""
    return tool(version).find(root)


def release_ldflags(version: str, gomod: str) -> str:
    """The linker flags of upstream's release build, from the text of Helm's go.mod."""
    match = _CLIENT_GO_RE.search(gomod)
    if match is None:
        raise BuildError(f"the go.mod of {HELM_MODULE}@{version} requires no k8s.io/client-go: "
                         f"is it a Helm 3 release?")
    major, minor = str(int(match.group(1)) + 1), match.group(2)
    flags = ["-s", "-w", f"-X {HELM_MODULE}/internal/version.version={version}"]
    for package in ("pkg/lint/rules", "pkg/chartutil"):
        flags += [f"-X {HELM_MODULE}/{package}.k8sVersionMajor={major}",
                  f"-X {HELM_MODULE}/{package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


def ensure(version: str = HELM_VERSION, *, root: Path | None = None,
           progress: Progress = lambda _: None,
           clock: Callable[[], float] = time.monotonic, spawn: Spawn = popen) -> Path:
    """The helm binary: found, or built into the cache (one builder at a time)."""
    found = find(version, root)
    if found is not None:
        return found
    progress(f"fetching {HELM_MODULE}@{version} from the Go module proxy")
    ldflags = release_ldflags(version, _download_gomod(version))
    return tool(version, ldflags).ensure(root=root, progress=progress, clock=clock,
                                         spawn=spawn)


def _download_gomod(version: str) -> str:
    go = find_go(f"building Helm {version} needs the Go toolchain ('go') on PATH: install Go "
                 f"1.26 or newer, or set {OVERRIDE} to a helm binary")
    module = download(go, HELM_MODULE, version, failed=lambda reason: (
        f"Helm {version} cannot be fetched from the Go module proxy ({reason})"))
    return module.gomod.read_text()
