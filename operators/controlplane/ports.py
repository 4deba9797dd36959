"""Loopback ports for the listeners fakefleet starts: chosen outside the kernel's ephemeral
range, and claimed again after a restart.

Most of these ports are remembered (a member's API server, its engine's kubelet port, Kueue's
webhooks, the hub): kubeconfigs, nodes and webhook configurations name them, so a restarted
process must get the same one back. A port from the ephemeral range (what binding port 0
gives) can meanwhile be the local end of any outgoing connection on the machine, a watch that
lasts minutes included, and the listener then cannot start again until it closes. Ports below
that range are never handed out to outgoing connections.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from operators.controlplane.errors import PortInUseError

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default, for a machine that does not say.
DEFAULT_EPHEMERAL = (32768, 60999)
#: Below it: ports of well-known and commonly installed services.
LOWEST = 10000
#: Fewer free ports than this outside the ephemeral range: let the kernel choose.
ENOUGH = 1000
ATTEMPTS = 64


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int]:
    """The first and last port the kernel gives outgoing connections."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def listener_ports(ephemeral: tuple[int, int]) -> list[range]:
    """The ranges a listener's port is chosen from: outside ``ephemeral``, above LOWEST."""
    low, high = ephemeral
    ranges = [range(LOWEST, low), range(high + 1, 65536)]
    return [found for found in ranges if len(found) >= ENOUGH]


def free_port() -> int:
    """A loopback port that nothing listens on or connects from right now, outside the
    ephemeral range when the machine leaves enough room there."""
    ranges = listener_ports(ephemeral_range())
    for _ in range(ATTEMPTS if ranges else 0):
        chosen = random.choice(ranges)
        port = random.randrange(chosen.start, chosen.stop)
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        found: int = probe.getsockname()[1]
        return found


def claim_port(port: int | None, what: str) -> int:
    """``port`` if it is free (or a free one when ``None``); a clear error when it is taken."""
    if port is None:
        return free_port()
    if not _bindable(port, reuse=True):
        raise PortInUseError(port, what)
    return port


def _bindable(port: int, *, reuse: bool = False) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if reuse:
            # As Go's listeners do: connections of a previous run in TIME_WAIT do not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
