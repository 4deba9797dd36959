"""What every ``fakefleet`` command shares: the consoles it writes to, where its state is, and
how it reaches the host cluster of that state.

It defines no command and prints nothing itself.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console

from operators.api.base import API_VERSION
from operators.api.clusters import KUBECONFIG_KEY
from operators.controlplane.errors import StateError
from operators.controlplane.state import StateDir
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import K8sError, NotFound
from primitives.flags import number

T = TypeVar("T")

# Messages to a file, a pipe or a test are not wrapped: an error stays one line that scripts
# can search (rich would break it at 80 columns).
console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())
# Tables piped to a file or a test keep their columns instead of wrapping at 80.
stdout = Console() if sys.stdout.isatty() else Console(width=160)


class Seconds(click.ParamType[float]):
    """A finite number of seconds within bounds (click's ``float`` takes ``nan`` and ``inf``,
    and its ``FloatRange`` lets ``nan`` through)."""

    name = "seconds"

    def __init__(self, lo: float, hi: float) -> None:
        self._parse = number(lo, hi, "a number of seconds")

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            value = repr(value)
        try:
            return self._parse(str(value))
        except argparse.ArgumentTypeError as error:
            self.fail(str(error), param, ctx)


#: A wait a command may be given: from no time at all to a week.
WAIT = Seconds(0, 7 * 86400)


def default_state_dir() -> Path:
    """``$FAKEFLEET_STATE_DIR``, else ``$XDG_STATE_HOME/fakefleet``, else ~/.local/state/."""
    explicit = os.environ.get("FAKEFLEET_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "fakefleet"


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir,
    show_default="$FAKEFLEET_STATE_DIR or ~/.local/state/fakefleet",
    help="Where the control plane keeps its data, certificates and logs.",
)


def host_client(state_dir: Path) -> Client:
    """A client of the host cluster that ``fakefleet up`` started in ``state_dir``."""
    path = StateDir(state_dir.resolve()).host_kubeconfig
    if not path.exists():
        raise StateError(f"no host cluster in {state_dir}: start it with 'fakefleet up'")
    return Client.connect(load_kubeconfig_file(path))


def split_cluster(cluster: str) -> tuple[str, str]:
    """A FakeCluster as users name it, [NAMESPACE/]NAME: (namespace, name)."""
    namespace, _, name = cluster.rpartition("/")
    return namespace or "default", name


async def named_member_kubeconfig(host: Client, namespace: str, name: str) -> str:
    """The kubeconfig of FakeCluster ``namespace/name`` (:func:`member_kubeconfig`)."""
    try:
        found = await host.get(f"/apis/{API_VERSION}/namespaces/{namespace}/fakeclusters/{name}")
    except NotFound:
        raise StateError(f"FakeCluster {namespace}/{name} does not exist: see "
                         f"'fakefleet get'") from None
    return await member_kubeconfig(host, found)


def run_k8s(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` against the host cluster; an unexpected answer is a readable error."""
    try:
        return asyncio.run(work)
    except K8sError as error:
        raise StateError(f"the host cluster did not answer as expected: {error}") from error


async def member_kubeconfig(host: Client, cluster: dict[str, Any]) -> str:
    """The kubeconfig of the FakeCluster ``cluster`` (as the host API serves it), from the
    Secret its status names; StateError while it has none yet."""
    namespace, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
    status = cluster.get("status") or {}
    secret_name = status.get("kubeconfigSecret")
    if not secret_name:
        raise StateError(f"FakeCluster {namespace}/{name} has no kubeconfig yet (phase "
                         f"{status.get('phase', 'Pending')}): wait for it with 'fakefleet wait'")
    ref = (cluster["spec"].get("controlPlane") or {}).get("kubeconfigSecretRef") or {}
    secret = await host.get(f"/api/v1/namespaces/{namespace}/secrets/{secret_name}")
    return base64.b64decode(secret.get("data", {}).get(ref.get("key", KUBECONFIG_KEY))).decode()
