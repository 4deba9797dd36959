"""One shared etcd and any number of local clusters on it, each a real kube-apiserver with its
own ``--etcd-prefix`` (plus, optionally, kube-scheduler and kube-controller-manager).

Everything a restart needs to find the same clusters again lives in the state directory
(:mod:`~operators.controlplane.state`): each cluster's ports (endpoints stay stable), PKI,
kubeconfigs and logs. The state directory is private (0700), and so are keys and kubeconfigs
(0600), from their
creation: they hold the credentials of every cluster.

The substrate supervises its processes while its event loop runs and stops them all in
:meth:`Substrate.stop`. When the process dies they die with it (the supervisor's death
signal), unless the substrate has a ``subreaper`` (the operator under the daemon of
``fakefleet up``): then its clusters' processes are detached, outlive it, and the next
substrate on the same state directory adopts them (:mod:`~operators.controlplane.detaching`),
so a member's API server never stops answering across an operator's restart. etcd is the
daemon's then; the substrate of an operator without a daemon runs its own, and it dies with it.

When spans are exported (``OTEL_EXPORTER_OTLP_ENDPOINT``), etcd and every kube-apiserver the
substrate starts send theirs to the same endpoint (:mod:`~operators.controlplane.components`
says which requests they trace).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from operators.controlplane import components, health, kubeconfigs
from operators.controlplane.binaries import Binaries
from operators.controlplane.components import ClusterPorts, EtcdPorts, Profile, RequestLimits
from operators.controlplane.errors import PortInUseError, StateError
from operators.controlplane.etcd import (
    EtcdEndpoint,
    EtcdFiles,
    count_etcd_keys,
    delete_etcd_prefix,
    read_ports,
    write_ports,
)
from operators.controlplane.limits import check_inotify
from operators.controlplane.pki import (
    CLIENTS,
    ENGINE,
    ClusterPKI,
    KubeletPKI,
    ensure_etcd_pki,
    ensure_front_proxy_pki,
    ensure_kubelet_pki,
    ensure_pki,
)
from operators.controlplane.ports import claim_port, free_port
from operators.controlplane.state import ComponentState, StateDir
from operators.controlplane.supervising import Supervised
from primitives.files import private_directory, write_private

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """What to run for one cluster."""

    scheduler: bool = True
    controller_manager: bool = True
    apiserver_port: int | None = None
    profile: Profile = Profile.DEFAULT
    binaries: Binaries | None = None
    """Binaries of another Kubernetes version than the substrate's default."""
    limits: RequestLimits | None = None
    """The API server's request limits, if not its profile's (a benchmark trying others)."""
    node_monitor_grace: float | None = None
    """The controller-manager's --node-monitor-grace-period in seconds (None: its default)."""

    @property
    def components(self) -> list[str]:
        """The processes of the cluster, in the order they start."""
        return ["kube-apiserver", *(["kube-scheduler"] if self.scheduler else []),
                *(["kube-controller-manager"] if self.controller_manager else [])]


@dataclasses.dataclass
class LocalCluster:
    """A running local cluster."""

    name: str
    state: StateDir
    ports: ClusterPorts
    options: ClusterOptions
    pki: ClusterPKI
    processes: dict[str, Supervised]
    #: Its kubelets' CA and the API server's client certificate for them.
    kubelet_pki: KubeletPKI

    @property
    def directory(self) -> Path:
        return self.state.cluster(self.name)

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def kubeconfig_path(self) -> Path:
        return self.kubeconfig_of("admin")

    @property
    def engine_kubeconfig_path(self) -> Path:
        """The engine's own identity in the cluster (:data:`~operators.controlplane.pki.
        ENGINE`), which its RBAC must grant first (:mod:`operators.engine.authorizing`)."""
        return self.kubeconfig_of(ENGINE)

    def kubeconfig_of(self, client: str) -> Path:
        """The kubeconfig of ``client``, one of :data:`~operators.controlplane.pki.CLIENTS`."""
        return self.state.kubeconfig(self.name, client)

    @property
    def apiserver(self) -> Supervised:
        return self.processes["kube-apiserver"]

    def admin_tls(self) -> Any:
        return health.client_tls(
            self.pki.ca_cert, self.pki.client_cert("admin"), self.pki.client_key("admin")
        )


def write_kubeconfigs(cluster: LocalCluster) -> None:
    """Write the kubeconfig of every client of ``cluster``, private from their creation."""
    for client in CLIENTS:
        write_private(cluster.kubeconfig_of(client), kubeconfigs.render(
            cluster=cluster.name, server=cluster.endpoint, ca_cert=cluster.pki.ca_cert,
            client_cert=cluster.pki.client_cert(client),
            client_key=cluster.pki.client_key(client), user=client,
        ).encode())


class Substrate:
    """A shared etcd and the local clusters that store their data in it."""

    def __init__(
        self,
        state_dir: Path,
        binaries: Binaries,
        *,
        etcd_port: int | None = None,
        etcd: EtcdEndpoint | None = None,
        fsync: bool = True,
        startup_timeout: float = 90.0,
        environ: Mapping[str, str] | None = None,
        subreaper: int | None = None,
    ) -> None:
        """With ``etcd``, attach to an etcd that someone else runs (the host's:
        :func:`~operators.controlplane.etcd.shared_etcd`). ``fsync=False`` is for tests and
        benchmarks only: the etcd this substrate runs may then lose data on a machine crash.
        ``environ``: the ``OTEL_*`` variables that say where etcd and the kube-apiservers send
        their spans (default: this process's own, as its SDK reads them; the daemon of
        ``fakefleet up`` gives the operator its collector's). ``subreaper``: the pid of the
        child subreaper that the clusters' processes are detached to (None: they die with this
        process)."""
        self.state_dir = state_dir
        #: host:port of the OTLP/gRPC endpoint of etcd and the apiservers (None: untraced).
        self.tracing = components.tracing_endpoint(os.environ if environ is None else environ)
        self.binaries = binaries
        self.startup_timeout = startup_timeout
        self._etcd_port = etcd_port
        self._attached = etcd is not None
        self._endpoint = etcd
        self._fsync = fsync
        self._subreaper = subreaper
        self._etcd: Supervised | None = None
        self._etcd_ports: EtcdPorts | None = None
        self.clusters: dict[str, LocalCluster] = {}

    async def __aenter__(self) -> Substrate:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def etcd(self) -> EtcdEndpoint:
        if self._endpoint is None:
            raise StateError("etcd is not started: call Substrate.start() first")
        return self._endpoint

    async def start(self) -> None:
        """Start the shared etcd (reusing its data and ports from an earlier run)."""
        private_directory(self.state_dir)
        if self._attached:
            healthy, detail = await health.probe(self.etcd.health_url, self.etcd.tls())
            if not healthy:
                raise StateError(f"the shared etcd at {self.etcd.url} is not healthy "
                                 f"({detail}): is 'fakefleet up' running?")
            return
        files = EtcdFiles.of(self.state_dir)
        files.directory.mkdir(exist_ok=True)
        pki = ensure_etcd_pki(files.pki.directory)
        stored = read_ports(files)
        if stored is not None:
            ports = EtcdPorts(
                client=claim_port(self._etcd_port or stored.client, "etcd"),
                peer=claim_port(stored.peer, "etcd's peer listener"),
            )
        else:
            ports = EtcdPorts(
                client=claim_port(self._etcd_port, "etcd"),
                peer=claim_port(None, "etcd's peer listener"),
            )
        write_ports(files, ports)
        self._etcd_ports = ports
        self._endpoint = EtcdEndpoint(components.etcd_client_url(ports), pki)
        argv = components.etcd_argv(
            self.binaries.etcd, files.data_dir, ports, pki, fsync=self._fsync,
            tracing=self.tracing,
        )
        # etcd alone gets SIGTERM when orphaned: it stops quickly and flushes its data.
        self._etcd = Supervised("etcd", argv, log_path=files.log_path,
                                death_signal=signal.SIGTERM)
        await self._etcd.start()
        try:
            await health.wait_healthy(
                self._etcd, self.etcd.health_url, self.etcd.tls(), timeout=self.startup_timeout
            )
        except BaseException:
            await self._etcd.stop()
            raise

    async def add_cluster(
        self, name: str, options: ClusterOptions | None = None
    ) -> LocalCluster:
        """Start (or restart, with the same ports and credentials) the cluster ``name``."""
        if name in self.clusters:
            return self.clusters[name]
        options = options or ClusterOptions()
        kinds = options.components
        state = StateDir(self.state_dir)
        state.cluster(name).mkdir(parents=True, exist_ok=True)
        pki = ensure_pki(state.pki(name), name)
        front_proxy = ensure_front_proxy_pki(state.front_proxy_pki(name))
        kubelet = ensure_kubelet_pki(state.kubelet_pki(name), name)
        cluster = LocalCluster(name, state, self._remembered_ports(state, name, options),
                               options, pki, processes={}, kubelet_pki=kubelet)
        write_kubeconfigs(cluster)
        binaries = options.binaries or self.binaries
        tracing_config = self._tracing_config(state, name)

        def component(kind: str, ports: ClusterPorts) -> tuple[Supervised, str, Any]:
            """The component's process with ``ports``, and its health URL and TLS."""
            if kind == "kube-apiserver":
                argv = components.apiserver_argv(
                    binaries.kube_apiserver, cluster=name, etcd_url=self.etcd.url,
                    etcd_pki=self.etcd.pki, port=ports.apiserver, pki=pki,
                    profile=options.profile, tracing_config=tracing_config,
                    front_proxy=front_proxy, kubelet=kubelet, limits=options.limits)
                url, tls = f"https://127.0.0.1:{ports.apiserver}/readyz", cluster.admin_tls()
            elif kind == "kube-scheduler":
                argv = components.scheduler_argv(
                    binaries.kube_scheduler, kubeconfig=cluster.kubeconfig_of(kind),
                    port=ports.scheduler, profile=options.profile)
                url, tls = f"https://127.0.0.1:{ports.scheduler}/healthz", health.insecure_tls()
            else:
                argv = components.controller_manager_argv(
                    binaries.kube_controller_manager, kubeconfig=cluster.kubeconfig_of(kind),
                    port=ports.controller_manager, pki=pki, profile=options.profile,
                    node_monitor_grace=options.node_monitor_grace)
                url = f"https://127.0.0.1:{ports.controller_manager}/healthz"
                tls = health.insecure_tls()
            return Supervised(f"{name}/{kind}", argv, log_path=state.component_log(name, kind),
                              subreaper=self._subreaper), url, tls

        self.clusters[name] = cluster
        try:
            # What an earlier operator left running on these ports is adopted; the rest is
            # started, on its remembered port if that is free.
            adopted = set()
            for kind in kinds:
                process, url, tls = component(kind, cluster.ports)
                if await health.adopt(process, url, tls):
                    cluster.processes[kind] = process
                    adopted.add(kind)
            await asyncio.to_thread(check_inotify, f"the control plane of cluster {name!r}",
                                    [kind for kind in kinds if kind not in adopted])
            cluster.ports = self._claim_ports(cluster.ports, adopted, name)
            write_private(state.ports_file(name), (json.dumps(
                {"ports": dataclasses.asdict(cluster.ports)}, indent=2) + "\n").encode())
            for kind in kinds:
                if kind in adopted:
                    continue
                process, url, tls = component(kind, cluster.ports)
                cluster.processes[kind] = process
                await process.start()
                await health.wait_healthy(process, url, tls, timeout=self.startup_timeout)
        except BaseException:
            await self._stop_cluster(cluster)
            del self.clusters[name]
            raise
        return cluster

    async def remove_cluster(self, name: str, *, purge: bool) -> None:
        """Stop a cluster's processes; with ``purge``, delete its etcd data and its files."""
        cluster = self.clusters.pop(name, None)
        if cluster is not None:
            await self._stop_cluster(cluster)
        if purge:
            await self.delete_etcd_prefix(components.etcd_prefix(name) + "/")
            shutil.rmtree(StateDir(self.state_dir).cluster(name), ignore_errors=True)

    async def stop(self) -> None:
        """Stop every cluster, then etcd. Data stays for the next start."""
        for name in list(self.clusters):
            await self._stop_cluster(self.clusters.pop(name))
        if self._etcd is not None:
            await self._etcd.stop()
            self._etcd = None

    def components(self) -> list[ComponentState]:
        """Every supervised process, etcd first, as ``fakefleet status`` lists them."""
        found: list[ComponentState] = []
        if self._etcd is not None and self._etcd_ports is not None:
            found.append(ComponentState(
                cluster=None, name="etcd", pid=self._etcd.pid, port=self._etcd_ports.client,
                healthUrl=self.etcd.health_url, log=str(self._etcd.log_path),
                restarts=self._etcd.restarts,
            ))
        for cluster in self.clusters.values():
            ports = {
                "kube-apiserver": (cluster.ports.apiserver, f"{cluster.endpoint}/readyz"),
                "kube-scheduler": (
                    cluster.ports.scheduler,
                    f"https://127.0.0.1:{cluster.ports.scheduler}/healthz",
                ),
                "kube-controller-manager": (
                    cluster.ports.controller_manager,
                    f"https://127.0.0.1:{cluster.ports.controller_manager}/healthz",
                ),
            }
            for component, process in cluster.processes.items():
                port, url = ports[component]
                found.append(ComponentState(
                    cluster=cluster.name, name=component, pid=process.pid, port=port,
                    healthUrl=url, log=str(process.log_path), restarts=process.restarts,
                ))
        return found

    async def count_etcd_keys(self, prefix: str) -> int:
        return await count_etcd_keys(self.etcd, prefix)

    async def delete_etcd_prefix(self, prefix: str) -> int:
        return await delete_etcd_prefix(self.etcd, prefix)

    def _tracing_config(self, state: StateDir, name: str) -> Path | None:
        """Write the cluster's apiserver TracingConfiguration when spans are exported (and
        remove one left from a traced run when not); its path, or None."""
        path = state.tracing_config(name)
        if self.tracing is None:
            path.unlink(missing_ok=True)
            return None
        write_private(path, components.tracing_configuration(self.tracing).encode())
        return path

    @staticmethod
    def _remembered_ports(state: StateDir, name: str, options: ClusterOptions) -> ClusterPorts:
        """The ports the cluster had (free ones for those it never had), not yet claimed: its
        processes may still hold them, to be adopted."""
        stored: dict[str, Any] = {}
        if state.ports_file(name).exists():
            try:
                stored = json.loads(state.ports_file(name).read_text()).get("ports", {})
            except (ValueError, AttributeError):  # cut short by a crash: choose ports anew
                logger.warning("%s is unreadable; choosing new ports", state.ports_file(name))
        return ClusterPorts(
            apiserver=options.apiserver_port or stored.get("apiserver") or free_port(),
            scheduler=stored.get("scheduler") or free_port(),
            controller_manager=stored.get("controller_manager") or free_port(),
        )

    @staticmethod
    def _claim_ports(ports: ClusterPorts, adopted: set[str], name: str) -> ClusterPorts:
        """The ports of the processes to start, checked free: the API server's is in every
        kubeconfig (a clear error if it is taken), the others change if they must."""
        apiserver, scheduler, controller_manager = dataclasses.astuple(ports)
        if "kube-apiserver" not in adopted:
            apiserver = claim_port(apiserver, f"the kube-apiserver of cluster {name!r}")
        if "kube-scheduler" not in adopted:
            scheduler = _free_or_other(scheduler)
        if "kube-controller-manager" not in adopted:
            controller_manager = _free_or_other(controller_manager)
        return ClusterPorts(apiserver, scheduler, controller_manager)

    @staticmethod
    async def _stop_cluster(cluster: LocalCluster) -> None:
        # Dependants first, so they do not log storms of errors against a vanished apiserver.
        for component in ("kube-controller-manager", "kube-scheduler", "kube-apiserver"):
            process = cluster.processes.get(component)
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    await process.stop()


def _free_or_other(port: int) -> int:
    try:
        return claim_port(port, "")
    except PortInUseError:
        return free_port()
