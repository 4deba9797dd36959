"""KWOK's own controller, for side-by-side runs: built from the Go module proxy into the
per-user cache, configured with its fast node and pod stages and leases as kwokctl does.

Nothing of KWOK is committed here: the binary is built by ``go install`` and the stage YAML is
read from the module cache, where ``go mod download`` put it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from operators.controlplane.binaries import cache_root
from operators.controlplane.errors import BuildError

KWOK_MODULE = "sigs.k8s.io/kwok"
KWOK_VERSION = "v0.8.0"
#: The stages kwokctl configures by default with leases on: node-fast, lease heartbeat,
#: pod-fast (ready, complete, delete).
STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
NODE_ANNOTATION = "kwok.x-k8s.io/node"


def kwok_binary(version: str = KWOK_VERSION) -> Path:
    """``$FAKEFLEET_KWOK``, else the cached build, else ``go install`` into the cache."""
    explicit = os.environ.get("FAKEFLEET_KWOK")
    if explicit:
        return Path(explicit)
    target = cache_root() / "kwok" / version / "kwok"
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise BuildError("building KWOK for the benchmark needs the Go toolchain on PATH "
                         "(or FAKEFLEET_KWOK pointing at a kwok binary)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        env = {**os.environ, "GOBIN": staging, "CGO_ENABLED": "0"}
        proc = subprocess.run(
            [go, "install", "-trimpath", f"{KWOK_MODULE}/cmd/kwok@{version}"],
            env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"go install {KWOK_MODULE}/cmd/kwok@{version} failed:\n"
                             f"{proc.stderr[-2000:]}")
        Path(staging, "kwok").rename(target)
    return target


def stage_config(version: str = KWOK_VERSION) -> str:
    """KWOK's fast stages from its module source, as one multi-document YAML."""
    go = shutil.which("go") or "go"
    proc = subprocess.run([go, "mod", "download", "-json", f"{KWOK_MODULE}@{version}"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"cannot fetch {KWOK_MODULE}@{version}: {proc.stdout}{proc.stderr}")
    source = Path(json.loads(proc.stdout)["Dir"])
    return "\n---\n".join((source / stage).read_text() for stage in STAGES)


def kwok_argv(binary: Path, kubeconfig: Path, config: Path) -> list[str]:
    """The controller as kwokctl runs it: annotated nodes only, leases of 40 s."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
        "--node-lease-duration-seconds=40",
        "--node-ip=10.0.0.1",
        "--cidr=10.0.0.0/16",
        "-v=WARN",
    ]
