"""Listener ports: outside the kernel's ephemeral range, and a taken one said clearly."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from operators.controlplane import ports
from operators.controlplane.errors import PortInUseError


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaulted(tmp_path: Path) -> None:
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("40000\t50000\n")
    assert ports.ephemeral_range(setting) == (40000, 50000)
    setting.write_text("garbage\n")
    assert ports.ephemeral_range(setting) == ports.DEFAULT_EPHEMERAL
    assert ports.ephemeral_range(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL


@pytest.mark.parametrize(("ephemeral", "expected"), [
    ((32768, 60999), [range(10000, 32768), range(61000, 65536)]),
    ((1024, 65535), []),                      # nothing outside: the kernel chooses
    ((10500, 65000), []),                     # 500 and 535 ports: too few either side
    ((20000, 64000), [range(10000, 20000), range(64001, 65536)]),
])
def test_listeners_get_ports_outside_the_ephemeral_range(
        ephemeral: tuple[int, int], expected: list[range]) -> None:
    assert ports.listener_ports(ephemeral) == expected


def test_a_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    low, high = ports.ephemeral_range()
    for _ in range(20):
        port = ports.free_port()
        if ports.listener_ports((low, high)):
            assert not low <= port <= high
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))


def test_a_taken_port_is_refused_naming_it_and_who_wanted_it() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        with pytest.raises(PortInUseError, match=str(taken)) as refused:
            ports.claim_port(taken, "the kube-apiserver of cluster 'west'")
        assert "west" in str(refused.value)
    assert ports.claim_port(taken, "the kube-apiserver of cluster 'west'") == taken
