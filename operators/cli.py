"""``fakefleet``: the command line.

``up`` builds (or finds) the binaries with visible progress, starts the daemon that owns the host
control plane and returns once it is Ready; ``down`` stops it; ``status`` shows every component;
``kubeconfig`` prints the host cluster's kubeconfig. Errors are one clear message and exit 1.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from operators.controlplane import binaries as binaries_
from operators.controlplane import daemon, health
from operators.controlplane.components import Profile
from operators.controlplane.errors import ControlPlaneError, StateError
from operators.controlplane.supervising import tail

console = Console(stderr=True)
stdout = Console()


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
version_option = click.option(
    "--kubernetes-version",
    default=binaries_.DEFAULT_KUBERNETES_VERSION,
    show_default=True,
    help="Kubernetes release of the control-plane binaries.",
)


class FleetGroup(click.Group):
    """Turns fakefleet's own errors into one readable line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ControlPlaneError as error:
            console.print(f"[bold red]error:[/] {error}", highlight=False)
            sys.exit(1)


@click.group(cls=FleetGroup)
def main() -> None:
    """Fleets of simulated Kubernetes clusters on real control planes."""


def _resolve_binaries(version: str) -> binaries_.Binaries:
    started = time.monotonic()
    with console.status(f"looking for Kubernetes {version} binaries") as status:
        def progress(step: str) -> None:
            elapsed = time.monotonic() - started
            status.update(f"[{elapsed:5.0f}s] {step} (a cold build takes many minutes)")
            console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {step}", highlight=False)

        return binaries_.resolve(version, progress=progress)


@main.command()
@version_option
def binaries(kubernetes_version: str) -> None:
    """Build (or find in the cache) etcd and the Kubernetes binaries; print their paths."""
    found = _resolve_binaries(kubernetes_version)
    for name in binaries_.OVERRIDES:
        click.echo(f"{name}\t{found.path(name)}")


@main.command()
@state_dir_option
@version_option
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Loopback port of the host kube-apiserver (default: a free one).")
@click.option("--profile", type=click.Choice([p.value for p in Profile]), default="default",
              show_default=True, help="'load' lifts the API request limits for load tests.")
@click.option("--timeout", type=float, default=120.0, show_default=True,
              help="Seconds to wait for the host cluster to become Ready.")
def up(state_dir: Path, kubernetes_version: str, port: int | None, profile: str,
       timeout: float) -> None:
    """Start the host control plane (etcd, apiserver, scheduler, controller-manager)."""
    state_dir = state_dir.resolve()
    if daemon.daemon_alive(state_dir):
        host = daemon.read_host(state_dir)
        if host and host.get("ready"):
            console.print(f"fakefleet is already up in {state_dir}")
            _print_usage(state_dir, host)
            return
        raise StateError(f"a fakefleet daemon on {state_dir} is starting or stuck: see "
                         f"{state_dir / daemon.LOG_FILE}, or run 'fakefleet down'")
    _resolve_binaries(kubernetes_version)
    (state_dir / daemon.HOST_FILE).unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "operators.controlplane.daemon", "--state-dir", str(state_dir),
        "--kubernetes-version", kubernetes_version, "--profile", profile,
        "--startup-timeout", str(timeout),
    ]
    if port is not None:
        argv += ["--port", str(port)]
    state_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (state_dir / daemon.LOG_FILE).open("ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    with console.status("starting etcd, kube-apiserver, kube-scheduler, kube-controller-manager"):
        host = _wait_for_daemon(state_dir, process, timeout + 30)
    console.print(f"[green]host control plane Ready[/] in {time.monotonic() - started:.1f}s "
                  f"({kubernetes_version}, state in {state_dir})")
    _print_usage(state_dir, host)


def _wait_for_daemon(state_dir: Path, process: subprocess.Popen[bytes],
                     timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        host = daemon.read_host(state_dir)
        if host is not None and host.get("pid") == process.pid:
            if host.get("ready"):
                return host
            if host.get("error"):
                process.wait(timeout=30)
                raise StateError(str(host["error"]))
        if process.poll() is not None:
            raise StateError(
                f"the fakefleet daemon exited with code {process.returncode} before the host "
                f"cluster was Ready; its log ({state_dir / daemon.LOG_FILE}) ends with:\n"
                f"{tail(state_dir / daemon.LOG_FILE, 15)}"
            )
        if time.monotonic() > deadline:
            process.send_signal(signal.SIGTERM)
            raise StateError(f"the host cluster was not Ready after {timeout:.0f}s: see the "
                             f"logs in {state_dir}")
        time.sleep(0.2)


def _print_usage(state_dir: Path, host: dict[str, Any]) -> None:
    flag = "" if state_dir == default_state_dir().resolve() else f" --state-dir {state_dir}"
    console.print(f"  endpoint:   {host['endpoint']}\n"
                  f"  kubeconfig: {host['kubeconfig']}\n"
                  f"  try:        kubectl --kubeconfig {host['kubeconfig']} get ns\n"
                  f"              fakefleet status{flag}\n"
                  f"              fakefleet down{flag}", highlight=False, soft_wrap=True)


@main.command()
@state_dir_option
@click.option("--timeout", type=float, default=60.0, show_default=True)
def down(state_dir: Path, timeout: float) -> None:
    """Stop everything `up` started. Data and certificates stay for the next `up`."""
    state_dir = state_dir.resolve()
    host = daemon.read_host(state_dir)
    if not daemon.daemon_alive(state_dir):
        (state_dir / daemon.HOST_FILE).unlink(missing_ok=True)
        console.print(f"fakefleet is not running in {state_dir}")
        return
    if host is None:
        raise StateError(f"a daemon holds {state_dir / daemon.LOCK_FILE} but published no "
                         f"state; stop it by hand (see {state_dir / daemon.LOG_FILE})")
    pid = int(host["pid"])
    children = [int(c["pid"]) for c in host.get("components", []) if c.get("pid")]
    with console.status("stopping the host control plane"):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while daemon.daemon_alive(state_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        if daemon.daemon_alive(state_dir):
            os.kill(pid, signal.SIGKILL)
        _wait_gone(children, deadline=time.monotonic() + 15)
    console.print(f"fakefleet stopped ({state_dir})")


def _wait_gone(pids: list[int], *, deadline: float) -> None:
    """Wait for processes to exit; kill any that the daemon's shutdown left behind."""
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


@main.command()
@state_dir_option
def status(state_dir: Path) -> None:
    """Show each component of the host control plane: pid, port, health."""
    state_dir = state_dir.resolve()
    host = daemon.read_host(state_dir)
    if host is None or not daemon.daemon_alive(state_dir):
        raise StateError(f"fakefleet is not running in {state_dir}: start it with 'fakefleet up'")
    host_dir = state_dir / "clusters" / daemon.HOST_CLUSTER / "pki"
    admin_tls = health.client_tls(host_dir / "ca.crt", host_dir / "admin.crt",
                                  host_dir / "admin.key")
    results = asyncio.run(_probe_all(host["components"], admin_tls))
    table = Table(title=f"fakefleet {host['kubernetesVersion']} in {state_dir}")
    for column in ("cluster", "component", "pid", "port", "restarts", "health"):
        table.add_column(column)
    for component, (healthy, detail) in zip(host["components"], results, strict=True):
        table.add_row(
            component["cluster"] or "(shared)", component["name"], str(component["pid"]),
            str(component["port"]), str(component["restarts"]),
            "[green]ok[/]" if healthy else f"[red]{detail[:60]}[/]",
        )
    stdout.print(table)


async def _probe_all(components: list[dict[str, Any]], admin_tls: Any) -> list[tuple[bool, str]]:
    def tls_for(component: dict[str, Any]) -> Any:
        if component["name"] == "kube-apiserver":
            return admin_tls
        return health.insecure_tls() if component["healthUrl"].startswith("https") else None

    return list(await asyncio.gather(
        *(health.probe(c["healthUrl"], tls_for(c)) for c in components)
    ))


@main.command()
@state_dir_option
def kubeconfig(state_dir: Path) -> None:
    """Print the host cluster's kubeconfig: kubectl --kubeconfig <(fakefleet kubeconfig) ..."""
    path = state_dir.resolve() / "clusters" / daemon.HOST_CLUSTER / "kubeconfig"
    if not path.exists():
        raise StateError(f"no host cluster in {state_dir}: start it with 'fakefleet up'")
    sys.stdout.write(path.read_text())
