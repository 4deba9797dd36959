"""``fakefleet``: the command line.

``up`` builds (or finds) the binaries with visible progress, starts the daemon that owns the host
control plane and returns once it is Ready; ``down`` stops it; ``status`` shows every component;
``kubeconfig`` prints the host cluster's kubeconfig. Errors are one clear message and exit 1.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click
import yaml
from click.core import ParameterSource
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from federation.client.channels import HubAddress
from federation.client.channels import health as hub_health
from federation.client.discovery import HubFiles, HubInfo
from federation.telemetry.files import CollectorFiles, CollectorInfo
from operators import (
    fleetcli,
    kueuecli,
    tracecli,
    workloadcli,  # noqa: F401  (adds fleet submit, workload, workloads)
)
from operators.addons.kueue import KUEUE_VERSION
from operators.addons.kueue import TOOL as KUEUE
from operators.addons.metricsserver import METRICS_SERVER_VERSION
from operators.addons.metricsserver import TOOL as METRICS_SERVER
from operators.api.base import API_VERSION
from operators.api.clusters import KUBECONFIG_KEY
from operators.api.faultplans import FaultPlan, FaultPlanSpec
from operators.controlplane import binaries as binaries_
from operators.controlplane import daemon, health, helm
from operators.controlplane.components import Profile
from operators.controlplane.errors import ControlPlaneError, StateError
from operators.controlplane.etcd import shared_etcd
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
from operators.faults import progress
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig_file
from operators.k8s.errors import Conflict, Invalid, K8sError, NotFound, transient
from operators.terminal import console, default_state_dir, state_dir_option, stdout

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
@click.option("--no-kueue", is_flag=True, help="Do not build Kueue (the FakeCluster add-on).")
@click.option("--no-metrics-server", is_flag=True,
              help="Do not build metrics-server (the FakeCluster add-on).")
@click.option("--no-helm", is_flag=True,
              help="Do not build Helm (what 'make chart' and the chart's tests run).")
def binaries(kubernetes_version: str, no_kueue: bool, no_metrics_server: bool,
             no_helm: bool) -> None:
    """Build (or find in the cache) etcd, the Kubernetes binaries, Kueue, metrics-server and
    Helm; print their paths."""
    found = _resolve_binaries(kubernetes_version)
    for name in binaries_.OVERRIDES:
        click.echo(f"{name}\t{found.path(name)}")
    if not no_kueue:
        click.echo(f"kueue\t{_resolve_tool(f'Kueue {KUEUE_VERSION}', KUEUE.ensure)}")
    if not no_metrics_server:
        click.echo("metrics-server\t" + str(_resolve_tool(
            f"metrics-server {METRICS_SERVER_VERSION}", METRICS_SERVER.ensure)))
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


@main.command()
@state_dir_option
@version_option
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Loopback port of the host kube-apiserver (default: a free one).")
@click.option("--profile", type=click.Choice([p.value for p in Profile]), default="default",
              show_default=True, help="'load' lifts the API request limits for load tests.")
@click.option("--timeout", type=float, default=120.0, show_default=True,
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


@main.command()
@state_dir_option
@click.option("--timeout", type=float, default=60.0, show_default=True)
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


@main.command()
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
    results = asyncio.run(_probe_all(state, components))
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


async def _probe_all(state: StateDir, components: list[ComponentState]) -> list[
        tuple[bool, str]]:
    etcd_tls = shared_etcd(state.root).tls()

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

    return list(await asyncio.gather(*(probe(c) for c in components)))


def _host_client(state_dir: Path) -> Client:
    path = StateDir(state_dir.resolve()).host_kubeconfig
    if not path.exists():
        raise StateError(f"no host cluster in {state_dir}: start it with 'fakefleet up'")
    return Client.connect(load_kubeconfig_file(path))


def _current(obj: dict[str, Any]) -> bool:
    """Whether the object's status was written for its current generation."""
    status = obj.get("status") or {}
    return bool(status.get("observedGeneration") == obj["metadata"].get("generation"))


def _split(cluster: str) -> tuple[str, str]:
    namespace, _, name = cluster.rpartition("/")
    return namespace or "default", name


@main.command()
@state_dir_option
def get(state_dir: Path) -> None:
    """List the FakeClusters of the fleet: phase, nodes, version, endpoint."""
    async def fetch() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with _host_client(state_dir) as client:
            clusters = await client.get(f"/apis/{API_VERSION}/fakeclusters")
            pools = await client.get(f"/apis/{API_VERSION}/fakenodepools")
        return clusters["items"], pools["items"]

    clusters, pools = _run_k8s(fetch())
    table = Table(title="fakefleet clusters")
    for column in ("namespace", "name", "phase", "pools", "nodes", "ready", "version",
                   "endpoint"):
        table.add_column(column, justify="right" if column in ("nodes", "ready") else "left")
    for item in clusters:
        meta, status = item["metadata"], item.get("status") or {}
        own = [p["metadata"]["name"] for p in pools
               if p["metadata"]["namespace"] == meta["namespace"]
               and p["spec"]["clusterRef"] == meta["name"]]
        phase = status.get("phase", "Pending")
        table.add_row(meta["namespace"], meta["name"],
                      f"[green]{phase}[/]" if phase == "Ready" else phase, ", ".join(own),
                      str(status.get("nodes", 0)), str(status.get("readyNodes", 0)),
                      status.get("kubernetesVersion", ""), status.get("endpoint", ""))
    stdout.print(table, soft_wrap=True)


@main.command()
@state_dir_option
@click.option("--timeout", type=float, default=300.0, show_default=True)
def wait(state_dir: Path, timeout: float) -> None:
    """Wait, with progress, until every FakeCluster and FakeNodePool is Ready."""
    async def poll() -> tuple[int, int, int, int]:
        async with _host_client(state_dir) as client:
            clusters = (await client.get(f"/apis/{API_VERSION}/fakeclusters"))["items"]
            pools = (await client.get(f"/apis/{API_VERSION}/fakenodepools"))["items"]
        desired_per_cluster: dict[tuple[str, str], int] = {}
        for pool in pools:
            key = (pool["metadata"]["namespace"], pool["spec"]["clusterRef"])
            desired_per_cluster[key] = desired_per_cluster.get(key, 0) + pool["spec"]["replicas"]
        ready_clusters = sum(
            1 for c in clusters
            if _current(c) and c["status"].get("phase") == "Ready"
            and c["status"].get("readyNodes") == desired_per_cluster.get(
                (c["metadata"]["namespace"], c["metadata"]["name"]), 0))
        desired = sum(p["spec"]["replicas"] for p in pools)
        # A pool counts only once its status describes its current spec (kubectl scale).
        ready = sum(min(p["status"].get("readyReplicas", 0), p["spec"]["replicas"])
                    if _current(p) else 0 for p in pools)
        return ready_clusters, len(clusters), ready, desired

    deadline = time.monotonic() + timeout
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as progress:
        clusters_bar = progress.add_task("clusters Ready", total=None)
        nodes_bar = progress.add_task("nodes Ready", total=None)
        while True:
            ready_clusters, total_clusters, ready, desired = _run_k8s(poll())
            progress.update(clusters_bar, completed=ready_clusters, total=total_clusters)
            progress.update(nodes_bar, completed=ready, total=desired)
            if ready_clusters == total_clusters and ready == desired:
                return
            if time.monotonic() > deadline:
                raise StateError(f"the fleet was not Ready after {timeout:.0f}s: "
                                 f"{ready_clusters}/{total_clusters} clusters, "
                                 f"{ready}/{desired} nodes; see 'fakefleet get'")
            time.sleep(0.5)


@main.command()
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
    namespace, name = _split(cluster)

    async def fetch() -> str:
        async with _host_client(state_dir) as client:
            try:
                found = await client.get(
                    f"/apis/{API_VERSION}/namespaces/{namespace}/fakeclusters/{name}")
            except NotFound:
                raise StateError(f"FakeCluster {namespace}/{name} does not exist: see "
                                 f"'fakefleet get'") from None
            ref = found["spec"].get("controlPlane", {}).get("kubeconfigSecretRef") or {}
            secret_name = (found.get("status") or {}).get("kubeconfigSecret")
            if not secret_name:
                raise StateError(f"FakeCluster {namespace}/{name} has no kubeconfig yet "
                                 f"(phase {(found.get('status') or {}).get('phase', 'Pending')})")
            secret = await client.get(f"/api/v1/namespaces/{namespace}/secrets/{secret_name}")
        data = secret.get("data", {}).get(ref.get("key", KUBECONFIG_KEY))
        return base64.b64decode(data).decode()

    sys.stdout.write(_run_k8s(fetch()))


T = TypeVar("T")


def _run_k8s(work: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(work)
    except K8sError as error:
        raise StateError(f"the host cluster did not answer as expected: {error}") from error


# -- fault plans -------------------------------------------------------------------------------

#: Seconds between two looks at a watched plan.
PLAN_POLL_INTERVAL = 1.0
#: What ``tone`` a progress line has, as a colour on a terminal (none in a log).
_TONES = {"": "", "good": "green", "bad": "red"}


class PlanGroup(click.Group):
    """Errors of the plan commands exit 2, so that none is mistaken for a Failed verdict (1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ControlPlaneError as error:
            console.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False,
                          soft_wrap=True)
            sys.exit(progress.EXIT_ERROR)


@dataclasses.dataclass(frozen=True)
class _PlanTarget:
    """Where the plan commands find the host cluster and the plans."""

    state_dir: Path
    host_kubeconfig: Path | None

    def client(self) -> Client:
        if self.host_kubeconfig is None:
            return _host_client(self.state_dir)
        try:
            return Client.connect(load_kubeconfig_file(self.host_kubeconfig))
        except K8sError as error:
            raise StateError(f"--kubeconfig {self.host_kubeconfig}: {error}") from error

    def kubeconfig_path(self) -> Path:
        return self.host_kubeconfig or StateDir(self.state_dir.resolve()).host_kubeconfig

    def flags(self, namespace: str) -> str:
        """The options that lead another fakefleet command to the same plan."""
        flags = f" -n {namespace}" if namespace != "default" else ""
        if self.host_kubeconfig is not None:
            return f"{flags} --kubeconfig {self.host_kubeconfig}"
        if self.state_dir.resolve() != default_state_dir().resolve():
            return f"{flags} --state-dir {self.state_dir}"
        return flags


Command = Callable[..., None]


def _plan_options(namespace_default: str) -> Callable[[Command], Command]:
    """--state-dir or --kubeconfig, -n and --timeout."""
    def decorate(command: Command) -> Command:
        for option in (
            click.option("--timeout", type=click.FloatRange(min=0), default=3600.0,
                         show_default=True, help="Seconds to wait for the plan to end (and "
                                                 "for a deleted plan to be gone)."),
            click.option("-n", "--namespace", default=None,
                         help=f"Namespace of the plan and of the FakeClusters it targets  "
                              f"[default: {namespace_default}]"),
            click.option("--kubeconfig", "host_kubeconfig", default=None,
                         type=click.Path(dir_okay=False, exists=True, path_type=Path),
                         help="Kubeconfig of the host cluster, in place of --state-dir (a "
                              "host fakefleet up did not start)."),
            state_dir_option,
        ):
            command = option(command)
        return command

    return decorate


def _plan_target(state_dir: Path, host_kubeconfig: Path | None) -> _PlanTarget:
    source = click.get_current_context().get_parameter_source("state_dir")
    if host_kubeconfig is not None and source is ParameterSource.COMMANDLINE:
        raise StateError("give --state-dir or --kubeconfig, not both: --kubeconfig names the "
                         "host cluster directly, --state-dir finds its kubeconfig")
    return _PlanTarget(state_dir, host_kubeconfig)


@main.group(cls=PlanGroup)
def plan() -> None:
    """Run FaultPlans: faults injected into the fleet on a schedule, and verdicts on how the
    system under test reacted.

    \b
    Exit codes of every plan command:
      0  the plan ended with verdict Passed (run/watch), or the command did its job
      1  the plan's verdict is Failed: an expectation did not hold in time
      2  anything else: a timeout, a plan that ended without a verdict, an error
    """


plan_output_option = click.option(
    "-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="json: the outcome as JSON on standard output (verdict, expectations, trace id), the "
         "progress log on standard error.")


@plan.command("run")
@click.argument("file", type=click.File("r"))
@click.option("--watch", is_flag=True,
              help="Follow the plan until it ends and exit with its verdict.")
@click.option("--replace", is_flag=True,
              help="If a plan of the same name exists, delete it (waiting until its faults "
                   "recovered) and create it again: the plan runs anew.")
@_plan_options("the file's metadata.namespace, else default")
@plan_output_option
def plan_run(file: TextIO, watch: bool, replace: bool, state_dir: Path,
             host_kubeconfig: Path | None, namespace: str | None, timeout: float,
             output: str) -> None:
    """Create the FaultPlans of FILE ('-': standard input); --watch follows them to the end.

    A plan's spec cannot change once created. A plan that already exists with the same spec is
    left as it is (and --watch follows it); one with another spec is refused: delete it first
    (fakefleet plan delete NAME) or give --replace, which also re-runs an unchanged plan.

    Workloads a plan acts on (Jobs, Deployments) go to the member cluster with kubectl, not in
    FILE. Without --watch, the command prints how to follow the plan. With --watch, each
    change of the plan is printed as a line (a log, no terminal needed), and the exit code is
    the verdict's: 0 Passed, 1 Failed, 2 still running after --timeout, ended without a
    verdict, or an error (130: interrupted; the plan goes on). It ends with each plan's trace
    id and the command that shows the trace.
    """
    target = _plan_target(state_dir, host_kubeconfig)
    plans = _read_plans(file, namespace)
    log = console if output == "json" else stdout
    outcomes: list[dict[str, str]] = []

    async def apply() -> None:
        async with target.client() as client:
            for found in plans:
                outcome = await _apply_plan(client, found, replace=replace, timeout=timeout,
                                            target=target, log=log)
                console.print(f"faultplan {found.namespace}/{found.name} {outcome}",
                              highlight=False, soft_wrap=True)
                outcomes.append({"namespace": found.namespace, "name": found.name,
                                 "outcome": outcome})

    _run_k8s(apply())
    keys = [(found.namespace, found.name) for found in plans]
    if watch:
        sys.exit(_watch_and_conclude(target, keys, timeout=timeout, output=output))
    if output == "json":
        click.echo(json.dumps(outcomes, indent=2))
        return
    for namespace_, name in keys:
        console.print(
            f"  watch: fakefleet plan watch {name}{target.flags(namespace_)}\n"
            f"         kubectl --kubeconfig {target.kubeconfig_path()} get fp {name}"
            f"{f' -n {namespace_}' if namespace_ != 'default' else ''} -w",
            highlight=False, soft_wrap=True)


@plan.command("watch")
@click.argument("name")
@_plan_options("default")
@plan_output_option
def plan_watch(name: str, state_dir: Path, host_kubeconfig: Path | None,
               namespace: str | None, timeout: float, output: str) -> None:
    """Follow an existing FaultPlan to its end, a line per change; exit with its verdict.

    Exit codes: 0 Passed, 1 Failed, 2 still running after --timeout, ended without a verdict,
    or an error (130: interrupted; the plan goes on).
    """
    target = _plan_target(state_dir, host_kubeconfig)
    sys.exit(_watch_and_conclude(target, [(namespace or "default", name)], timeout=timeout,
                                 output=output))


@plan.command("delete")
@click.argument("name")
@_plan_options("default")
def plan_delete(name: str, state_dir: Path, host_kubeconfig: Path | None,
                namespace: str | None, timeout: float) -> None:
    """Delete a FaultPlan and wait until it is gone. The operator first recovers every fault
    the plan still holds in place (a finalizer keeps the plan until then), so the fleet is
    whole again when this returns."""
    target = _plan_target(state_dir, host_kubeconfig)
    namespace = namespace or "default"

    async def delete() -> None:
        async with target.client() as client:
            try:
                await client.delete(_plans_path(namespace, name))
            except NotFound:
                raise StateError(f"FaultPlan {namespace}/{name} does not exist: "
                                 f"kubectl get fp -n {namespace} lists the plans") from None
            await _wait_deleted(client, namespace, name, timeout=timeout)

    _run_k8s(delete())
    console.print(f"faultplan {namespace}/{name} deleted, its faults recovered",
                  highlight=False, soft_wrap=True)


@dataclasses.dataclass(frozen=True)
class _PlanDocument:
    namespace: str
    name: str
    body: dict[str, Any]
    spec: FaultPlanSpec


def _read_plans(file: TextIO, namespace: str | None) -> list[_PlanDocument]:
    """The FaultPlans of ``file``, checked against the API's model before anything is sent."""
    source = file.name
    try:
        documents = [document for document in yaml.safe_load_all(file) if document is not None]
    except yaml.YAMLError as error:
        raise StateError(f"{source} is not YAML: {error}") from error
    if not documents:
        raise StateError(f"{source} holds no document: give a file with a FaultPlan")
    plans: list[_PlanDocument] = []
    for number, document in enumerate(documents, 1):
        where = f"{source}, document {number}"
        kind = document.get("kind") if isinstance(document, dict) else None
        if kind != "FaultPlan":
            raise StateError(
                f"{where} is {f'a {kind}' if kind else 'not a Kubernetes object'}, not a "
                f"FaultPlan: apply other objects with kubectl (workloads go to the member "
                f"cluster: kubectl --kubeconfig <(fakefleet kubeconfig CLUSTER) apply -f ...)")
        if document.get("apiVersion") != API_VERSION:
            raise StateError(f"{where}: apiVersion {document.get('apiVersion')!r}: a FaultPlan "
                             f"is {API_VERSION}")
        metadata = document.get("metadata") or {}
        name = metadata.get("name")
        if not name:
            raise StateError(f"{where}: the FaultPlan has no metadata.name: give it one")
        own = metadata.get("namespace")
        if namespace and own and own != namespace:
            raise StateError(f"{where}: FaultPlan {name} is in namespace {own}, but -n gives "
                             f"{namespace}: drop one of them")
        try:
            spec = FaultPlan.model_validate(document).spec
        except ValidationError as error:
            raise StateError(f"{where}: FaultPlan {name} is not valid:\n"
                             f"{_validation_errors(error)}") from None
        namespace_ = namespace or own or "default"
        if any((p.namespace, p.name) == (namespace_, name) for p in plans):
            raise StateError(f"{where}: FaultPlan {namespace_}/{name} is in {source} twice: "
                             f"give each plan its own name")
        body = {**document, "metadata": {**metadata, "namespace": namespace_}}
        plans.append(_PlanDocument(namespace_, name, body, spec))
    return plans


def _validation_errors(error: ValidationError) -> str:
    return "\n".join(
        f"  {'.'.join(str(part) for part in detail['loc'])}: {detail['msg']} "
        f"(got {detail['input']!r})" for detail in error.errors())


def _plans_path(namespace: str, name: str = "") -> str:
    path = f"/apis/{API_VERSION}/namespaces/{namespace}/faultplans"
    return f"{path}/{name}" if name else path


async def _apply_plan(client: Client, found: _PlanDocument, *, replace: bool, timeout: float,
                      target: _PlanTarget, log: Console) -> str:
    """Create the plan; what happened: created, unchanged or replaced."""
    described = f"FaultPlan {found.namespace}/{found.name}"
    if await _create_plan(client, found):
        return "created"
    existing = await client.get(_plans_path(found.namespace, found.name))
    if not replace:
        if _same_spec(existing, found.spec):
            return "unchanged"
        raise StateError(
            f"{described} already exists with another spec, and a plan's spec cannot change: "
            f"give --replace to delete it (its faults recover) and create it again, or delete "
            f"it first: fakefleet plan delete {found.name}{target.flags(found.namespace)}")
    console.print(f"faultplan {found.namespace}/{found.name} exists: deleting it first",
                  highlight=False, soft_wrap=True)
    await _wait_deleted(client, found.namespace, found.name, timeout=timeout, delete=True,
                        log=log)
    if not await _create_plan(client, found):
        raise StateError(f"{described} was created again by someone else meanwhile")
    return "replaced"


async def _create_plan(client: Client, found: _PlanDocument) -> bool:
    """Create the plan; False if one of that name exists."""
    try:
        await client.create(_plans_path(found.namespace), found.body)
    except Conflict as error:
        if error.already_exists:
            return False
        raise
    except Invalid as error:
        raise StateError(f"the host API server refused FaultPlan {found.namespace}/"
                         f"{found.name}: {error.message}") from error
    except NotFound as error:
        raise StateError(f"cannot create FaultPlan {found.namespace}/{found.name}: "
                         f"{error.message}; does namespace {found.namespace} exist, and is "
                         f"the FaultPlan CRD installed ('fakefleet up' installs it)?") from error
    return True


def _same_spec(existing: dict[str, Any], spec: FaultPlanSpec) -> bool:
    """Whether the plan in the API has ``spec``, defaults filled in on both sides."""
    try:
        current = FaultPlanSpec.model_validate(existing.get("spec") or {})
    except ValidationError:
        return False
    return current.model_dump() == spec.model_dump()


async def _wait_deleted(client: Client, namespace: str, name: str, *, timeout: float,
                        delete: bool = False, log: Console = stdout) -> None:
    """Wait until the plan is gone, showing its injections as they recover (on ``log``)."""
    path = _plans_path(namespace, name)
    if delete:
        with contextlib.suppress(NotFound):
            await client.delete(path)
    deadline = time.monotonic() + timeout
    shown: list[progress.Line] | None = None
    while True:
        try:
            found = await client.get(path)
        except NotFound:
            return
        if shown is None:
            shown = []
            console.print(f"waiting for FaultPlan {namespace}/{name} to recover its faults "
                          f"(a finalizer holds it until then)", highlight=False, soft_wrap=True)
        status = found.get("status") or {}
        lines = [line for line in progress.render(status) if line.key != "plan"]
        _show(progress.changes(shown, lines), log=log)
        shown = lines
        if time.monotonic() >= deadline:
            held = [f"{injection.get('step')}#{injection.get('occurrence', 0)}"
                    for injection in status.get("injections") or []
                    if injection.get("state") == "Injected"]
            raise StateError(
                f"FaultPlan {namespace}/{name} is still there after {timeout:.0f}s "
                f"(finalizers {found['metadata'].get('finalizers', [])}"
                f"{'; faults in place: ' + ', '.join(held) if held else ''}): is the operator "
                f"running ('fakefleet status')? kubectl describe fp {name} -n {namespace}")
        await asyncio.sleep(PLAN_POLL_INTERVAL)


def _show(lines: list[progress.Line], *, prefix: str = "", log: Console = stdout) -> None:
    """Print progress lines as a log: a time, then the line, coloured only on a terminal."""
    stamp = time.strftime("%H:%M:%S")
    for line in lines:
        text = Text(f"{stamp} ", style="dim")
        text.append(prefix + line.text, style=_TONES[line.tone])
        log.print(text, soft_wrap=True, highlight=False)


PlanKey = tuple[str, str]


async def _watch_plans(client: Client, keys: list[PlanKey], *, timeout: float,
                       log: Console = stdout) -> dict[PlanKey, dict[str, Any]]:
    """Poll the plans until each has finished or the timeout passed, printing what changed
    (on ``log``); their last statuses."""
    deadline = time.monotonic() + timeout
    statuses: dict[PlanKey, dict[str, Any]] = {}
    shown: dict[PlanKey, list[progress.Line]] = {}
    uids: dict[PlanKey, str] = {}
    trouble = ""
    while True:
        for key in keys:
            if key in statuses and progress.finished(statuses[key]):
                continue
            namespace, name = key
            try:
                found = await client.get(_plans_path(namespace, name))
            except NotFound:
                raise StateError(f"FaultPlan {namespace}/{name} does not exist (or was deleted "
                                 f"while watched): kubectl get fp -n {namespace}") from None
            except K8sError as error:
                if not transient(error):
                    raise
                if str(error) != trouble:
                    trouble = str(error)
                    _show([progress.Line("", f"the host API server did not answer ({error}); "
                                             f"trying again", "bad")], log=log)
                continue
            if trouble:
                trouble = ""
                _show([progress.Line("", "the host API server answers again")], log=log)
            uid = str(found["metadata"].get("uid", ""))
            if uids.setdefault(key, uid) != uid:
                raise StateError(f"FaultPlan {namespace}/{name} was deleted and created again "
                                 f"while watched: watch the new one with 'fakefleet plan watch "
                                 f"{name}'")
            statuses[key] = found.get("status") or {}
            lines = progress.render(statuses[key])
            _show(progress.changes(shown.get(key, []), lines),
                  prefix=f"{name}: " if len(keys) > 1 else "", log=log)
            shown[key] = lines
        done = all(key in statuses and progress.finished(statuses[key]) for key in keys)
        if done or time.monotonic() >= deadline:
            return statuses
        await asyncio.sleep(PLAN_POLL_INTERVAL)


def _watch_and_conclude(target: _PlanTarget, keys: list[PlanKey], *, timeout: float,
                        output: str = "text") -> int:
    """Watch the plans, print each one's results, ending with its trace; the exit code of the
    worst. ``output`` json: the results as JSON on stdout, everything else on stderr."""
    log = console if output == "json" else stdout

    async def watch() -> dict[PlanKey, dict[str, Any]]:
        async with target.client() as client:
            return await _watch_plans(client, keys, timeout=timeout, log=log)

    try:
        statuses = _run_k8s(watch())
    except KeyboardInterrupt:
        for namespace, name in keys:
            console.print(f"stopped watching; FaultPlan {namespace}/{name} goes on ('fakefleet "
                          f"plan delete {name}{target.flags(namespace)}' stops it and recovers "
                          f"its faults)", highlight=False, soft_wrap=True)
        return 130
    codes = []
    concluded = []
    for namespace, name in keys:
        status = statuses.get((namespace, name), {})
        flags = target.flags(namespace)
        if not progress.finished(status):
            console.print(f"[red]timed out[/] after {timeout:.0f}s: FaultPlan {namespace}/"
                          f"{name} has not ended; it goes on ('fakefleet plan watch {name}"
                          f"{flags}' follows it, 'fakefleet plan delete {name}{flags}' stops "
                          f"it)", highlight=False, soft_wrap=True)
        elif status.get("phase") not in progress.FINAL_PHASES:
            console.print(f"FaultPlan {namespace}/{name} failed; it goes on with its remaining "
                          f"steps and recoveries until it ends or 'fakefleet plan delete {name}"
                          f"{flags}'", highlight=False, soft_wrap=True)
        code = progress.exit_code(status)
        codes.append(code)
        if output == "json":
            concluded.append(_conclusion(namespace, name, status, code, target))
            continue
        _print_results(namespace, name, status)
        stdout.print(Text(f"{namespace}/{name}: {progress.summary(status)}",
                          style=_TONES["good" if code == progress.EXIT_PASSED else "bad"]),
                     soft_wrap=True, highlight=False)
        _print_trace(status, target)
    if output == "json":
        click.echo(json.dumps(concluded, indent=2))
    return max(codes)


def _trace_command(trace_id: str, target: _PlanTarget) -> str:
    """The command that shows a plan's trace: the collector of the same state directory."""
    flags = ""
    if target.host_kubeconfig is None and \
            target.state_dir.resolve() != default_state_dir().resolve():
        flags = f" --state-dir {target.state_dir}"
    return f"fakefleet trace show {trace_id}{flags}"


def _print_trace(status: dict[str, Any], target: _PlanTarget) -> None:
    """The plan's trace id, and how to see it (nothing when the operator recorded none)."""
    trace_id = str(status.get("traceId") or "")
    if trace_id:
        stdout.print(f"trace {trace_id}: {_trace_command(trace_id, target)}",
                     soft_wrap=True, highlight=False)


def _conclusion(namespace: str, name: str, status: dict[str, Any], code: int,
                target: _PlanTarget) -> dict[str, Any]:
    """A plan's outcome as ``-o json`` gives it."""
    trace_id = str(status.get("traceId") or "")
    return {
        "namespace": namespace, "name": name,
        "phase": status.get("phase") or "Pending", "verdict": status.get("verdict") or "",
        "stepsDone": status.get("stepsDone") or "", "summary": progress.summary(status),
        "exitCode": code, "traceId": trace_id,
        "traceCommand": _trace_command(trace_id, target) if trace_id else "",
        "expectations": [dataclasses.asdict(result) for result in progress.results(status)],
    }


def _print_results(namespace: str, name: str, status: dict[str, Any]) -> None:
    """The plan's expectations as a table, if it has any judged."""
    found = progress.results(status)
    if not found:
        return
    table = Table(title=f"FaultPlan {namespace}/{name}")
    for column in ("step", "occurrence", "expectation", "outcome", "latency", "message"):
        table.add_column(column, justify="right" if column in ("occurrence", "latency")
                         else "left")
    for result in found:
        table.add_row(result.step, str(result.occurrence), result.name,
                      Text(result.outcome, style=_TONES[progress.outcome_tone(result.outcome)]),
                      "" if result.latency is None else progress.seconds(result.latency),
                      result.message)
    stdout.print(table, soft_wrap=True)


main.add_command(fleetcli.fleet)
main.add_command(kueuecli.kueue)
main.add_command(tracecli.trace)
