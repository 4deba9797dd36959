"""The state directory, spelled once: every path in it, and the two files that say what runs.

    <state>/daemon.lock, daemon.log     the daemon of `fakefleet up` (one per directory)
    <state>/host.json                   what the daemon runs (HostState)
    <state>/operator.lock, operator.log the operator (one per directory)
    <state>/operator.json               what the operator runs: members and engines (OperatorState)
    <state>/host-id                     this host's id in the fleet (the hub's members are its)
    <state>/etcd/                       the shared etcd (operators.controlplane.etcd)
    <state>/hub/                        the federation hub: its key, state.json, hub.json,
                                        restore.json (a snapshot's state to take in)
                                        (federation.client.discovery), pki/, hub.log
    <state>/clusters/<key>/             one cluster: cluster.json (ports), pki/, kubeconfig
                                        (admin) and one per component, *.log, tracing.yaml
                                        (the kube-apiserver's, while spans are exported), and
                                        for members engine.log, member.kubeconfig (an adopted
                                        cluster's)
    <state>/clusters/<key>/**/<process>.process.json
                                        a detached process's identity (pid, start time,
                                        command line) beside its <process>.log: what the next
                                        operator adopts (operators.controlplane.detaching)
    <state>/clusters/<key>/front-proxy/ the aggregation layer's PKI (FrontProxyPKI)
    <state>/clusters/<key>/kubelet/     the kubelets' PKI (KubeletPKI): their CA, which the
                                        engine issues node certificates with, and the API
                                        server's client certificate for kubelets
    <state>/snapshots/<name>.snapshot   saved snapshots, private: they hold secrets
                                        (operators.snapshots.storing)
    <state>/clusters/<key>/engine.json  the engine's kubelet ports (EngineEndpoint), kept so its
                                        nodes' daemonEndpoints stay right across restarts
    <state>/clusters/<key>/<add-on>/    a member's add-on while it is set up there: kubeconfig,
                                        pki/, <add-on>.log and its own files (kueue/:
                                        config.yaml, ports.json; metrics-server/: port;
                                        karpenter/: ports.json, instance-types.json;
                                        kuberay/: ports.json), spelled
                                        by its package (operators.addons.running.Files)

``host`` is the key of the daemon's host cluster; members are keyed ``<namespace>.<name>``.
Every reader and writer of these files imports this module (an add-on's, through its
package); the JSON files are written
atomically (a reader never sees half of one).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import socket
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from operators.controlplane.etcd import EtcdFiles
from operators.controlplane.ports import free_port
from primitives.files import private_directory, write_private

HOST_CLUSTER = "host"


@dataclasses.dataclass(frozen=True)
class StateDir:
    """The paths of one state directory."""

    root: Path

    @property
    def daemon_lock(self) -> Path:
        return self.root / "daemon.lock"

    @property
    def daemon_log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def host_file(self) -> Path:
        return self.root / "host.json"

    @property
    def operator_lock(self) -> Path:
        return self.root / "operator.lock"

    @property
    def operator_log(self) -> Path:
        return self.root / "operator.log"

    @property
    def operator_file(self) -> Path:
        return self.root / "operator.json"

    @property
    def host_id_file(self) -> Path:
        return self.root / "host-id"

    def host_id(self) -> str:
        """This host's id in the fleet: made once (its hostname and a random part) and kept,
        so that the hub knows the members this host registered across restarts, and tells
        them from another host's of the same name."""
        path = self.host_id_file
        try:
            found = path.read_text().strip()
        except FileNotFoundError:
            found = None
        if found:
            return found
        made = f"{socket.gethostname()}-{secrets.token_hex(4)}"
        try:
            # An empty (torn) file is replaced; a missing one made only once.
            write_private(path, made.encode(), replace=found is not None)
        except FileExistsError:  # made meanwhile by another process
            return path.read_text().strip() or made
        return made

    @property
    def etcd(self) -> EtcdFiles:
        return EtcdFiles.of(self.root)

    @property
    def hub(self) -> Path:
        return self.root / "hub"

    @property
    def hub_pki(self) -> Path:
        return self.hub / "pki"

    @property
    def hub_log(self) -> Path:
        return self.hub / "hub.log"

    @property
    def clusters(self) -> Path:
        return self.root / "clusters"

    def cluster(self, key: str) -> Path:
        return self.clusters / key

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    def kubeconfig(self, key: str, client: str = "admin") -> Path:
        """A cluster's kubeconfig for ``client`` (admin, kube-scheduler, ...)."""
        name = "kubeconfig" if client == "admin" else f"{client}.kubeconfig"
        return self.cluster(key) / name

    def pki(self, key: str) -> Path:
        return self.cluster(key) / "pki"

    def ports_file(self, key: str) -> Path:
        return self.cluster(key) / "cluster.json"

    def tracing_config(self, key: str) -> Path:
        """The kube-apiserver's TracingConfiguration (``--tracing-config-file``)."""
        return self.cluster(key) / "tracing.yaml"

    def component_log(self, key: str, component: str) -> Path:
        """The log of a cluster's kube-apiserver, kube-scheduler or kube-controller-manager."""
        return self.cluster(key) / f"{component}.log"

    def engine_log(self, key: str) -> Path:
        return self.cluster(key) / "engine.log"

    def member_kubeconfig(self, key: str) -> Path:
        """The kubeconfig of an adopted cluster, as its engine reads it."""
        return self.cluster(key) / "member.kubeconfig"

    def front_proxy_pki(self, key: str) -> Path:
        return self.cluster(key) / "front-proxy"

    def kubelet_pki(self, key: str) -> Path:
        return self.cluster(key) / "kubelet"

    def engine_file(self, key: str) -> Path:
        return self.cluster(key) / "engine.json"

    @property
    def host_kubeconfig(self) -> Path:
        return self.kubeconfig(HOST_CLUSTER)

    def create(self) -> StateDir:
        private_directory(self.root)
        return self


class _Published(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ComponentState(_Published):
    """One process, as ``fakefleet status`` lists it."""

    cluster: str | None
    name: str
    pid: int | None
    port: int | None = None
    healthUrl: str | None = None
    log: str
    restarts: int = 0


class EngineEndpoint(_Published):
    """Where a member's engine serves its nodes' kubelets and its DCGM metrics
    (``engine.json``): chosen once, kept across restarts."""

    kubeletPort: int
    """Plain HTTP: the nodes' ``/metrics/resource`` (metrics-server's ``--kubelet-port``),
    the DCGM endpoint, ``/healthz``."""
    kubeletTlsPort: int | None = None
    """The kubelet API over TLS (logs), which the nodes advertise; None in an ``engine.json``
    written before there was one."""

    @property
    def dcgm_url(self) -> str:
        return f"http://127.0.0.1:{self.kubeletPort}/metrics"


def read_engine_endpoint(state: StateDir, key: str) -> EngineEndpoint | None:
    return _read(state.engine_file(key), EngineEndpoint)


def choose_engine_endpoint(state: StateDir, key: str) -> EngineEndpoint:
    """The member's engine ports: those it had (an engine of the previous operator holds
    them: it is adopted, or, stopping, holds them for a moment and the new one waits), else
    free ones that no other member's engine has (it may not be listening right now), written
    down before anything uses them."""
    found = read_engine_endpoint(state, key)
    if found is not None and found.kubeletTlsPort is not None:
        return found
    taken = {port for other in state.clusters.glob("*")
             if (endpoint := read_engine_endpoint(state, other.name)) is not None
             for port in (endpoint.kubeletPort, endpoint.kubeletTlsPort) if port}

    def port() -> int:
        chosen = free_port()
        while chosen in taken:
            chosen = free_port()
        taken.add(chosen)
        return chosen
    endpoint = EngineEndpoint(kubeletPort=found.kubeletPort if found else port(),
                              kubeletTlsPort=port())
    private_directory(state.cluster(key))
    publish(state.engine_file(key), endpoint)
    return endpoint


class HostState(_Published):
    """What the daemon of ``fakefleet up`` runs (``host.json``)."""

    pid: int
    ready: bool = False
    error: str | None = None
    startedAt: str = ""
    kubernetesVersion: str = ""
    profile: str = ""
    endpoint: str | None = None
    kubeconfig: str | None = None
    components: list[ComponentState] = []


class OperatorState(_Published):
    """What the operator runs (``operator.json``): ready once its handlers run."""

    pid: int
    ready: bool = False
    components: list[ComponentState] = []


def publish(path: Path, state: _Published) -> None:
    """Replace ``path`` with ``state`` at once (written aside, then renamed)."""
    write_private(path, (state.model_dump_json(indent=2) + "\n").encode())


def read_host(state: StateDir) -> HostState | None:
    """The daemon's published state, or None if it never wrote one."""
    return _read(state.host_file, HostState)


def read_operator(state: StateDir) -> OperatorState | None:
    return _read(state.operator_file, OperatorState)


Published = TypeVar("Published", bound=_Published)


def _read(path: Path, model: type[Published]) -> Published | None:
    try:
        return model.model_validate(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError, ValidationError):
        return None
