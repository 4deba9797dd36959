"""``fakefleet up|down|status|kubeconfig|binaries``: the host control plane's lifecycle.

``up`` builds (or finds) the binaries with visible progress, starts the daemon that owns the host
control plane and returns once it is Ready; ``down`` stops it; ``status`` shows every component;
``kubeconfig`` prints the host cluster's kubeconfig, or a FakeCluster's; ``binaries`` builds or
finds every binary and prints its path. The daemon itself runs the control plane: these
commands only start, stop, probe and read it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
from rich.table import Table

from federation.client.channels import HubAddress
from federation.client.channels import health as hub_health
from federation.client.discovery import HubFiles, HubInfo
from federation.telemetry.files import CollectorFiles, CollectorInfo
from operators.addons.custommetrics import TOOL as CUSTOM_METRICS_ADAPTER
from operators.addons.karpenter import KARPENTER_VERSION
from operators.addons.karpenter import TOOL as KARPENTER
from operators.addons.kuberay import KUBERAY_VERSION
from operators.addons.kuberay import TOOL as KUBERAY
from operators.addons.kueue import KUEUE_VERSION
from operators.addons.kueue import TOOL as KUEUE
from operators.addons.metricsserver import METRICS_SERVER_VERSION
from operators.addons.metricsserver import TOOL as METRICS_SERVER
from operators.addons.prometheus import PROMETHEUS_RELEASE
from operators.addons.prometheus import TOOL as PROMETHEUS
from operators.cli.terminal import (
    WAIT,
    console,
    default_state_dir,
    host_client,
    named_member_kubeconfig,
    run_k8s,
    split_cluster,
    state_dir_option,
    stdout,
)
from operators.controlplane import binaries as binaries_
from operators.controlplane import daemon, health, helm
from operators.controlplane.components import Profile
from operators.controlplane.errors import StateError
from operators.controlplane.etcd import alarm_message, etcd_alarms, shared_etcd
from operators.controlplane.helm import HELM_VERSION
from operators.controlplane.pki import ClusterPKI
from operators.controlplane.state import (
    ComponentState,
    HostState,
    StateDir,
    read_host,
    read_operator,
)
from operators.controlplane.supervising import tail

version_option = click.option(
    "--kubernetes-version",
    default=binaries_.DEFAULT_KUBERNETES_VERSION,
    show_default=True,
    help="Kubernetes release of the control-plane binaries.",
)


def _resolve_binaries(version: str) -> binaries_.Binaries:
    started = time.monotonic()
    with console.status(f"looking for Kubernetes {version} binaries") as status:
        def progress(step: str) -> None:
            elapsed = time.monotonic() - started
            status.update(f"[{elapsed:5.0f}s] {step} (a cold build takes many minutes)")
            console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {step}", highlight=False)

        return binaries_.resolve(version, progress=progress)


@click.command()
@version_option
@click.option("--no-kueue", is_flag=True, help="Do not build Kueue (the FakeCluster add-on).")
@click.option("--no-metrics-server", is_flag=True,
              help="Do not build metrics-server (the FakeCluster add-on).")
@click.option("--no-karpenter", is_flag=True,
              help="Do not build Karpenter's KWOK provider (the FakeCluster add-on; a cold "
                   "build takes about 17 minutes).")
@click.option("--no-kuberay", is_flag=True,
              help="Do not build KubeRay's operator (the FakeCluster add-on; a cold build "
                   "takes 4 to 13 minutes).")
@click.option("--no-custom-metrics", is_flag=True,
              help="Do not build Prometheus and the custom-metrics adapter (the FakeCluster "
                   "add-on customMetrics; a cold build takes about 30 minutes).")
@click.option("--no-helm", is_flag=True,
              help="Do not build Helm (what 'make chart' and the chart's tests run).")
def binaries(kubernetes_version: str, no_kueue: bool, no_metrics_server: bool,
             no_karpenter: bool, no_kuberay: bool, no_custom_metrics: bool,
             no_helm: bool) -> None:
    """Build (or find in the cache) etcd, the Kubernetes binaries, Kueue, metrics-server,
    Karpenter, KubeRay, Prometheus, the custom-metrics adapter and Helm; print their paths."""
    found = _resolve_binaries(kubernetes_version)
    for name in binaries_.OVERRIDES:
        click.echo(f"{name}\t{found.path(name)}")
    if not no_kueue:
        click.echo(f"kueue\t{_resolve_tool(f'Kueue {KUEUE_VERSION}', KUEUE.ensure)}")
    if not no_metrics_server:
        click.echo("metrics-server\t" + str(_resolve_tool(
            f"metrics-server {METRICS_SERVER_VERSION}", METRICS_SERVER.ensure)))
    if not no_karpenter:
        click.echo("karpenter\t" + str(_resolve_tool(f"Karpenter {KARPENTER_VERSION}",
                                                     KARPENTER.ensure)))
    if not no_kuberay:
        click.echo(f"kuberay\t{_resolve_tool(f'KubeRay {KUBERAY_VERSION}', KUBERAY.ensure)}")
    if not no_custom_metrics:
        # Prometheus first: the adapter's build reuses the packages they share.
        click.echo("prometheus\t" + str(_resolve_tool(f"Prometheus {PROMETHEUS_RELEASE}",
                                                      PROMETHEUS.ensure)))
        click.echo("custom-metrics-adapter\t" + str(_resolve_tool(
            "the custom-metrics adapter", CUSTOM_METRICS_ADAPTER.ensure)))
    if not no_helm:
        click.echo(f"helm\t{_resolve_tool(f'Helm {HELM_VERSION}', helm.ensure)}")


def _resolve_tool(title: str, ensure: Callable[..., Path]) -> Path:
    """A tool from the cache, or built with a progress line at least every 15 s."""
    with console.status(f"looking for {title}") as status:
        def progress(step: str) -> None:
            status.update(step)
            console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {step}", highlight=False)

        path: Path = ensure(progress=progress)
        return path


@click.command()
@state_dir_option
@version_option
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Loopback port of the host kube-apiserver (default: a free one).")
@click.option("--profile", type=click.Choice([p.value for p in Profile]), default="default",
              show_default=True, help="'load' lifts the API request limits for load tests.")
@click.option("--timeout", type=WAIT, default=120.0, show_default=True,
              help="Seconds to wait for the host cluster to become Ready.")
@click.option("--unsafe-no-fsync", is_flag=True,
              help="For tests and benchmarks: etcd does not fsync, so data may be lost on a "
                   "machine crash.")
@click.option("--no-hub", is_flag=True,
              help="Do not start the federation hub (FakeClusters then join no hub unless "
                   "their spec.federation names one).")
@click.option("--no-collector", is_flag=True,
              help="Do not start the embedded trace collector (same as FAKEFLEET_COLLECTOR=off).")
def up(state_dir: Path, kubernetes_version: str, port: int | None, profile: str,
       timeout: float, unsafe_no_fsync: bool, no_hub: bool, no_collector: bool) -> None:
    """Start the host control plane (etcd, apiserver, scheduler, controller-manager), the
    operator and the federation hub."""
    state_dir = state_dir.resolve()
    state = StateDir(state_dir)
    if daemon.daemon_alive(state_dir):
        host = read_host(state)
        if host and host.ready:
            console.print(f"fakefleet is already up in {state_dir}")
            _print_usage(state_dir, host)
            return
        raise StateError(f"a fakefleet daemon on {state_dir} is starting or stuck: see "
                         f"{state.daemon_log}, or run 'fakefleet down'")
    _resolve_binaries(kubernetes_version)
    state.host_file.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "operators.controlplane.daemon", "--state-dir", str(state_dir),
        "--kubernetes-version", kubernetes_version, "--profile", profile,
        "--startup-timeout", str(timeout),
    ]
    if port is not None:
        argv += ["--port", str(port)]
    if unsafe_no_fsync:
        argv.append("--unsafe-no-fsync")
    if no_hub:
        argv.append("--no-hub")
    if no_collector:
        argv.append("--no-collector")
    state.create()
    started = time.monotonic()
    with state.daemon_log.open("ab") as log:
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
                     timeout: float) -> HostState:
    state = StateDir(state_dir)
    deadline = time.monotonic() + timeout
    while True:
        host = read_host(state)
        if host is not None and host.pid == process.pid:
            if host.ready:
                return host
            if host.error:
                process.wait(timeout=30)
                raise StateError(host.error)
        if process.poll() is not None:
            raise StateError(
                f"the fakefleet daemon exited with code {process.returncode} before the host "
                f"cluster was Ready; its log ({state.daemon_log}) ends with:\n"
                f"{tail(state.daemon_log, 15)}"
            )
        if time.monotonic() > deadline:
            process.send_signal(signal.SIGTERM)
            raise StateError(f"the host cluster was not Ready after {timeout:.0f}s: see the "
                             f"logs in {state_dir}")
        time.sleep(0.2)


def _print_usage(state_dir: Path, host: HostState) -> None:
    flag = "" if state_dir == default_state_dir().resolve() else f" --state-dir {state_dir}"
    console.print(f"  endpoint:   {host.endpoint}\n"
                  f"  kubeconfig: {host.kubeconfig}\n"
                  f"  try:        kubectl --kubeconfig {host.kubeconfig} get ns\n"
                  f"              fakefleet status{flag}\n"
                  f"              fakefleet down{flag}", highlight=False, soft_wrap=True)


@click.command()
@state_dir_option
@click.option("--timeout", type=WAIT, default=60.0, show_default=True)
def down(state_dir: Path, timeout: float) -> None:
    """Stop everything `up` started. Data and certificates stay for the next `up`."""
    state_dir = state_dir.resolve()
    state = StateDir(state_dir)
    host = read_host(state)
    if not daemon.daemon_alive(state_dir):
        state.host_file.unlink(missing_ok=True)
        console.print(f"fakefleet is not running in {state_dir}")
        return
    if host is None:
        raise StateError(f"a daemon holds {state.daemon_lock} but published no "
                         f"state; stop it by hand (see {state.daemon_log})")
    pid = host.pid
    operator = read_operator(state)
    children = [c.pid for c in [*host.components, *(operator.components if operator else [])]
                if c.pid]
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


@click.command()
@state_dir_option
def status(state_dir: Path) -> None:
    """Show every process: the host control plane, the operator, and each member cluster's
    control plane and engine, with pid, port, restarts and health."""
    state_dir = state_dir.resolve()
    state = StateDir(state_dir)
    host = read_host(state)
    if host is None or not daemon.daemon_alive(state_dir):
        raise StateError(f"fakefleet is not running in {state_dir}: start it with 'fakefleet up'")
    operator = read_operator(state)
    members = operator.components if operator and any(
        c.name == "operator" and c.pid == operator.pid for c in host.components) else []
    components = [*host.components, *members]
    results, alarms = asyncio.run(_probe_all(state, components))
    table = Table(title=f"fakefleet {host.kubernetesVersion} in {state_dir}")
    for column in ("cluster", "component", "pid", "port", "restarts", "health"):
        table.add_column(column)
    for component, (healthy, detail) in zip(components, results, strict=True):
        table.add_row(
            component.cluster or "(shared)", component.name, str(component.pid),
            str(component.port or "-"), str(component.restarts),
            "[green]ok[/]" if healthy else f"[red]{detail[:60]}[/]",
        )
    stdout.print(table)
    if alarms:
        console.print(f"[bold red]etcd:[/] {alarm_message(alarms)}", highlight=False)


async def _probe_all(state: StateDir, components: list[ComponentState]) -> tuple[
        list[tuple[bool, str]], list[str]]:
    """Each component's health, and the alarms etcd raised (a full database among them)."""
    etcd = shared_etcd(state.root)
    etcd_tls = etcd.tls()

    async def probe(component: ComponentState) -> tuple[bool, str]:
        url = component.healthUrl
        if component.name == "operator":  # healthy once it has announced itself
            ready = daemon.operator_ready(state.root, component.pid)
            return ready, "ok" if ready else "not ready"
        if component.name == "hub":
            info = HubInfo.read(HubFiles(state.hub).info)
            if info is None or info.pid != component.pid:
                return False, "not serving yet"
            return await hub_health(HubAddress.of(info.address, info.ca))
        if component.name == "collector":
            serving = CollectorInfo.read(CollectorFiles.of(state.root).info)
            if serving is None or serving.pid != component.pid:
                return False, "not serving yet"
            return await hub_health(HubAddress(serving.address))
        if url is None:  # an engine: alive is healthy (it retries whatever fails)
            alive = component.pid is not None and _alive(component.pid)
            return alive, "ok" if alive else "not running"
        if component.name == "kube-apiserver" and component.cluster:
            pki = ClusterPKI(state.pki(component.cluster))
            return await health.probe(url, health.client_tls(
                pki.ca_cert, pki.client_cert("admin"), pki.client_key("admin")))
        if component.name == "etcd":
            return await health.probe(url, etcd_tls)
        return await health.probe(url, health.insecure_tls() if url.startswith("https") else None)

    healths, raised = await asyncio.gather(
        asyncio.gather(*(probe(c) for c in components)), etcd_alarms(etcd))
    return list(healths), raised


@click.command()
@state_dir_option
@click.argument("cluster", required=False)
def kubeconfig(state_dir: Path, cluster: str | None) -> None:
    """Print a kubeconfig: the host cluster's, or a FakeCluster's ([NAMESPACE/]NAME).

    kubectl --kubeconfig <(fakefleet kubeconfig) get fakeclusters
    """
    if cluster is None:
        path = StateDir(state_dir.resolve()).host_kubeconfig
        if not path.exists():
            raise StateError(f"no host cluster in {state_dir}: start it with 'fakefleet up'")
        sys.stdout.write(path.read_text())
        return
    namespace, name = split_cluster(cluster)

    async def fetch() -> str:
        async with host_client(state_dir) as client:
            return await named_member_kubeconfig(client, namespace, name)

    sys.stdout.write(run_k8s(fetch()))
