"""Pod IPs: unique, from the node's /24, recycled, overflowing into the shared range."""

from __future__ import annotations

from operators.engine.addresses import PodAddresses


def test_addresses_come_from_the_node_cidr_and_are_unique() -> None:
    pool = PodAddresses()
    first = [pool.allocate(3) for _ in range(3)]
    assert first == ["10.128.3.2", "10.128.3.3", "10.128.3.4"]
    assert pool.allocate(4) == "10.128.4.2"
    assert len(pool) == 4


def test_released_addresses_are_reused() -> None:
    pool = PodAddresses()
    address = pool.allocate(0)
    pool.allocate(0)
    pool.release(address)
    assert pool.allocate(0) == address


def test_a_full_node_overflows_without_duplicates() -> None:
    pool = PodAddresses()
    allocated = [pool.allocate(0) for _ in range(400)]
    assert len(set(allocated)) == 400
    assert allocated[252] == "10.128.0.254"
    assert allocated[253].startswith("100.64.")


def test_claimed_addresses_are_not_handed_out_again() -> None:
    pool = PodAddresses()
    pool.claim("10.128.1.5")
    handed = {pool.allocate(1) for _ in range(10)}
    assert "10.128.1.5" not in handed
    assert len(handed) == 10
