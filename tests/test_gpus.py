"""GPU identity: one UUID per GPU of the fleet, the same on every reading."""

from __future__ import annotations

import re

from operators.api.gpus import gpu_uuid

NVML_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def test_a_gpus_uuid_is_stable_and_in_nvml_form() -> None:
    assert gpu_uuid("west", "west-h100-0", 3) == gpu_uuid("west", "west-h100-0", 3)
    assert NVML_UUID.match(gpu_uuid("west", "west-h100-0", 3))


def test_no_two_gpus_of_a_fleet_share_a_uuid() -> None:
    uuids = {gpu_uuid(cluster, f"{cluster}-h100-{node}", index)
             for cluster in ("west", "east") for node in range(200) for index in range(8)}
    assert len(uuids) == 2 * 200 * 8
