"""``fakefleet up/status/kubeconfig/down`` as a user runs them, and their errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import aiohttp

from e2e.conftest import (
    CLUSTER,
    FAKEFLEET,
    KUBECTL,
    Fleet,
    eventually,
    fakefleet,
    processes_mentioning,
)
from operators.controlplane.etcd import shared_etcd


def test_up_status_kubeconfig_down(cli_state: Path) -> None:
    state = str(cli_state)
    first = fakefleet("up", "--state-dir", state)  # as a user runs it: etcd fsyncs
    assert "host control plane Ready" in first.stderr
    assert "--unsafe-no-fsync=true" not in _etcd_argv(cli_state)
    assert stat.S_IMODE(cli_state.stat().st_mode) == 0o700
    kubeconfig = cli_state / "clusters" / "host" / "kubeconfig"
    assert stat.S_IMODE(kubeconfig.stat().st_mode) == 0o600
    again = fakefleet("up", "--state-dir", state)
    assert "already up" in again.stderr

    status = fakefleet("status", "--state-dir", state).stdout
    for component in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager",
                      "hub", "operator", "collector"):
        assert component in status
    assert status.count(" ok ") == 7, status

    # The documented way to use it: kubectl --kubeconfig <(fakefleet kubeconfig) get ns
    listing = subprocess.run(
        ["bash", "-c",
         f"{KUBECTL} --kubeconfig <({FAKEFLEET} kubeconfig --state-dir {state}) get ns -o name"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    assert "namespace/kube-system" in listing

    host = json.loads((cli_state / "host.json").read_text())
    pids = [host["pid"], *(c["pid"] for c in host["components"])]
    assert len(pids) == 8  # daemon, etcd, apiserver, scheduler, KCM, hub, operator, collector
    fakefleet("down", "--state-dir", state)
    assert processes_mentioning(state) == []
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    assert "not running" in fakefleet("status", "--state-dir", state, check=False).stderr


def test_components_do_not_outlive_a_killed_daemon(cli_state: Path) -> None:
    """Nor do the member's processes, which are the daemon's children so as to outlive a
    killed operator."""
    fakefleet("up", "--state-dir", str(cli_state), "--unsafe-no-fsync")
    assert "--unsafe-no-fsync=true" in _etcd_argv(cli_state)
    fleet = Fleet(cli_state)
    fleet.apply(CLUSTER.format(name="doomed"))
    fleet.wait_cluster_ready("doomed")
    # The operator announces what it supervises on its own schedule, which can come just
    # after the FakeCluster's status says Ready.
    members = eventually(lambda: (found := fleet.member_processes("doomed")) and
                         {"kube-apiserver", "engine"} <= set(found) and found, timeout=30,
                         what="the operator to announce the member's processes")
    host = json.loads((cli_state / "host.json").read_text())
    for pid in members.values():
        assert Path(f"/proc/{pid}/stat").read_text().split(") ")[1].split()[1] == \
            str(host["pid"]), "a member's process is the daemon's child"
    os.kill(host["pid"], signal.SIGKILL)
    eventually(lambda: processes_mentioning(str(cli_state)) == [], timeout=30,
               what="components to exit after their daemon was killed")
    # ... and the state directory can be brought up again, with the same endpoint.
    again = fakefleet("up", "--state-dir", str(cli_state), "--unsafe-no-fsync")
    assert host["endpoint"] in again.stderr


def test_port_in_use_is_one_clear_error(cli_state: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = fakefleet("up", "--state-dir", str(cli_state), "--port", str(port),
                           "--unsafe-no-fsync", check=False)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "Traceback" not in result.stderr
    time.sleep(0.5)
    assert processes_mentioning(str(cli_state)) == []


def test_missing_binary_is_one_clear_error(cli_state: Path, tmp_path: Path) -> None:
    result = fakefleet("up", "--state-dir", str(cli_state), "--unsafe-no-fsync", check=False,
                       env={"FAKEFLEET_KUBE_APISERVER": str(tmp_path / "no-such-binary")})
    assert result.returncode == 1
    assert "FAKEFLEET_KUBE_APISERVER=" in result.stderr
    assert "does not name an executable kube-apiserver binary" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_version_is_one_clear_error(tmp_path: Path) -> None:
    env = {"FAKEFLEET_CACHE_DIR": str(tmp_path / "cache")}
    unknown = fakefleet("binaries", "--kubernetes-version", "v1.99.0", env=env, check=False)
    assert unknown.returncode == 1
    assert "Kubernetes version v1.99.0 cannot be fetched from the Go module proxy" in (
        unknown.stderr.replace("\n", " "))
    malformed = fakefleet("binaries", "--kubernetes-version", "1.36", env=env, check=False)
    assert malformed.returncode == 1
    assert "not of the form v1.MINOR.PATCH" in malformed.stderr
    assert "Traceback" not in unknown.stderr + malformed.stderr


def _etcd_argv(state: Path) -> list[str]:
    host = json.loads((state / "host.json").read_text())
    pid = next(c["pid"] for c in host["components"] if c["name"] == "etcd")
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] == "Z"
    except FileNotFoundError:
        return True


def test_a_full_etcd_is_shown_by_status_and_cleared_by_disarm(cli_state: Path) -> None:
    """etcd's NOSPACE alarm (raised here by hand, as a full database raises it) stops every
    write; status names it with the way out, and 'fakefleet etcd disarm' clears it."""
    state = str(cli_state)
    fakefleet("up", "--state-dir", state, "--no-hub", "--no-collector", "--unsafe-no-fsync")
    etcd = shared_etcd(cli_state)

    async def raise_nospace() -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{etcd.url}/v3/maintenance/status", json={},
                                    ssl=etcd.tls()) as response:
                member = (await response.json())["header"]["member_id"]
            async with session.post(f"{etcd.url}/v3/maintenance/alarm", ssl=etcd.tls(), json={
                    "action": "ACTIVATE", "memberID": member, "alarm": "NOSPACE"}) as response:
                response.raise_for_status()

    asyncio.run(raise_nospace())
    kubeconfig = str(cli_state / "clusters" / "host" / "kubeconfig")
    refused = subprocess.run([KUBECTL, "--kubeconfig", kubeconfig, "create", "namespace", "full"],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0, "a full etcd refuses writes"
    status = subprocess.run([FAKEFLEET, "status", "--state-dir", state], capture_output=True,
                            text=True, timeout=60)
    assert "NOSPACE alarm" in status.stderr
    assert "fakefleet etcd disarm" in status.stderr

    disarmed = fakefleet("etcd", "disarm", "--state-dir", state)
    assert "alarms cleared: NOSPACE" in disarmed.stderr
    assert "NOSPACE" not in fakefleet("status", "--state-dir", state).stderr
    eventually(lambda: subprocess.run(
        [KUBECTL, "--kubeconfig", kubeconfig, "create", "namespace", "full"],
        capture_output=True, timeout=60).returncode == 0, what="writes accepted again")
