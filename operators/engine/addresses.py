"""Pod IPs: unique per cluster, drawn from each node's /24 pod CIDR and recycled on release.

A node's /24 holds 253 pod addresses (.2-.254); a node that runs more pods than that (KWOK's
benchmark puts thousands on one node) continues in a shared overflow range, 100.64.0.0/10.
"""

from __future__ import annotations

import ipaddress

from operators.engine.nodes import POD_NETWORK

OVERFLOW = ipaddress.ip_network("100.64.0.0/10")
FIRST_HOST, LAST_HOST = 2, 254


class PodAddresses:
    """Allocates and recycles pod IPs for all nodes of one cluster."""

    def __init__(self) -> None:
        self._next: dict[int, int] = {}  # node slot -> next never-used host number
        self._free: dict[int, list[int]] = {}  # node slot -> recycled host numbers
        self._overflow_next = 1
        self._overflow_free: list[int] = []
        self._taken: set[str] = set()

    def allocate(self, slot: int) -> str:
        free = self._free.get(slot)
        if free:
            host = free.pop()
        elif (host := self._next.get(slot, FIRST_HOST)) <= LAST_HOST:
            self._next[slot] = host + 1
        else:
            return self._allocate_overflow()
        address = str(ipaddress.ip_address(int(POD_NETWORK.network_address) + (slot << 8) + host))
        self._taken.add(address)
        return address

    def claim(self, address: str) -> None:
        """Mark an address as used (a running pod adopted after a restart)."""
        self._taken.add(address)
        value = int(ipaddress.ip_address(address))
        if value in _range(POD_NETWORK):
            offset = value - int(POD_NETWORK.network_address)
            slot, host = offset >> 8, offset & 0xFF
            free = self._free.get(slot, [])
            if host in free:
                free.remove(host)
            elif host >= self._next.get(slot, FIRST_HOST):
                for skipped in range(self._next.get(slot, FIRST_HOST), host):
                    self._free.setdefault(slot, []).append(skipped)
                self._next[slot] = host + 1
        elif value in _range(OVERFLOW):
            number = value - int(OVERFLOW.network_address)
            if number in self._overflow_free:
                self._overflow_free.remove(number)
            self._overflow_next = max(self._overflow_next, number + 1)

    def release(self, address: str) -> None:
        if address not in self._taken:
            return
        self._taken.discard(address)
        value = int(ipaddress.ip_address(address))
        if value in _range(POD_NETWORK):
            offset = value - int(POD_NETWORK.network_address)
            self._free.setdefault(offset >> 8, []).append(offset & 0xFF)
        else:
            self._overflow_free.append(value - int(OVERFLOW.network_address))

    def __len__(self) -> int:
        return len(self._taken)

    def _allocate_overflow(self) -> str:
        if self._overflow_free:
            number = self._overflow_free.pop()
        else:
            number = self._overflow_next
            self._overflow_next += 1
        address = str(ipaddress.ip_address(int(OVERFLOW.network_address) + number))
        self._taken.add(address)
        return address


def _range(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> range:
    start = int(network.network_address)
    return range(start, start + network.num_addresses)
