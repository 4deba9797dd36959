"""KWOK's own controller, for side-by-side runs: built from the Go module proxy into the
per-user cache, configured with its fast node and pod stages and leases as kwokctl does.

Nothing of KWOK is committed here: the binary is built by ``go install`` and the stage YAML is
read from the module cache, where ``go mod download`` put it. ``python -m bench.kwok`` builds it
ahead (``make test`` and ``make bench`` do), so that no test or run waits for the build.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from operators.controlplane.modules import download, find_go
from operators.controlplane.tools import GoTool

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


def tool(version: str = KWOK_VERSION) -> GoTool:
    return GoTool(name="kwok", title="KWOK", package=f"{KWOK_MODULE}/cmd/kwok",
                  version=version, override="FAKEFLEET_KWOK")


def kwok_binary(version: str = KWOK_VERSION, *,
                progress: Callable[[str], None] = lambda _: None) -> Path:
    """``$FAKEFLEET_KWOK``, else the cached build, else ``go install`` into the cache, with
    a progress line at least every 15 s while it builds."""
    return tool(version).ensure(progress=progress)


def stage_config(version: str = KWOK_VERSION) -> str:
    """KWOK's fast stages from its module source, as one multi-document YAML."""
    go = find_go(f"reading KWOK {version}'s stages needs the Go toolchain ('go') on PATH: "
                 f"install Go 1.26 or newer")
    source = download(go, KWOK_MODULE, version, failed=lambda reason: (
        f"cannot fetch {KWOK_MODULE}@{version}: {reason}")).source
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


if __name__ == "__main__":
    print(kwok_binary(progress=lambda line: print(line, file=sys.stderr, flush=True)))
