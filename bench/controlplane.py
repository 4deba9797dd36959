"""Control-plane figures: binary resolution, start-up time and memory, printed as a table.

    python -m bench.controlplane [--extra-apiservers 3] [--idle 20]

Measures, on real processes:
- ``fakefleet binaries`` on a cache hit, and how long the cached build took (its manifest);
- ``fakefleet up`` until it returns (the host cluster's /readyz is OK), and ``fakefleet down``;
- resident memory of etcd + kube-apiserver + kube-scheduler + kube-controller-manager, idle;
- resident memory added by each extra kube-apiserver sharing the same etcd.

Results also go to ``bench/results/controlplane-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.terminating import sigterm_interrupts
from operators.controlplane import binaries as binaries_
from operators.controlplane.substrate import ClusterOptions, Substrate

RESULTS = Path(__file__).parent / "results"
FAKEFLEET = Path(sys.executable).parent / "fakefleet"


def rss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    return time.monotonic() - started


async def memory(binaries: binaries_.Binaries, state: Path, extra: int,
                 idle: float) -> dict[str, Any]:
    async with Substrate(state, binaries, fsync=False) as substrate:
        started = time.monotonic()
        host = await substrate.add_cluster("host")
        ready = time.monotonic() - started
        await asyncio.sleep(idle)
        etcd = next(c for c in substrate.components() if c.name == "etcd")
        per_component = {name: rss_mib(p.pid) for name, p in host.processes.items()}
        per_component["etcd"] = rss_mib(etcd.pid)
        before = sum(per_component.values())
        extra_ready = []
        for index in range(extra):
            started = time.monotonic()
            await substrate.add_cluster(
                f"extra-{index}", ClusterOptions(scheduler=False, controller_manager=False)
            )
            extra_ready.append(time.monotonic() - started)
        await asyncio.sleep(idle)
        after = sum(rss_mib(c.pid) for c in substrate.components())
        return {
            "hostReadySeconds": round(ready, 2),
            "idleRssMiB": {k: round(v, 1) for k, v in per_component.items()},
            "idleRssTotalMiB": round(before, 1),
            "extraApiservers": extra,
            "extraApiserverReadySeconds": [round(s, 2) for s in extra_ready],
            "rssPerExtraApiserverMiB": round((after - before) / extra, 1) if extra else None,
        }


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra-apiservers", type=int, default=3)
    parser.add_argument("--idle", type=float, default=20.0,
                        help="seconds to let components settle before reading memory")
    parser.add_argument("--runs", type=int, default=3, help="fakefleet up/down repetitions")
    args = parser.parse_args()
    console = Console()

    binaries = binaries_.resolve()
    warm = timed([str(FAKEFLEET), "binaries", "--kubernetes-version", binaries.version])
    manifest = json.loads(
        (binaries_.cache_entry(binaries.version) / "manifest.json").read_text()
    ) if not os.environ.get("FAKEFLEET_KUBE_APISERVER") else {}

    up_times, down_times = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as state:
            up_times.append(timed([str(FAKEFLEET), "up", "--state-dir", state,
                                   "--unsafe-no-fsync"]))
            down_times.append(timed([str(FAKEFLEET), "down", "--state-dir", state]))
    with tempfile.TemporaryDirectory(prefix="fakefleet-bench-") as state:
        mem = asyncio.run(memory(binaries, Path(state), args.extra_apiservers, args.idle))

    result = {
        "kubernetesVersion": binaries.version,
        "lastBuildSeconds": manifest.get("buildSeconds"),
        "warmResolveSeconds": round(warm, 3),
        "upSeconds": [round(s, 2) for s in up_times],
        "downSeconds": [round(s, 2) for s in down_times],
        **mem,
        "cpus": os.cpu_count(),
    }
    table = Table(title=f"fakefleet control plane, Kubernetes {binaries.version}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    rows = [
        ("last build into the cache (s; seconds if Go's build cache was warm)",
         str(result["lastBuildSeconds"])),
        ("fakefleet binaries, cache hit (s)", f"{warm:.2f}"),
        ("fakefleet up → Ready, median of runs (s)", f"{sorted(up_times)[len(up_times) // 2]:.2f}"),
        ("fakefleet down (s)", f"{sorted(down_times)[len(down_times) // 2]:.2f}"),
        ("host cluster added to a running etcd → Ready (s)", f"{mem['hostReadySeconds']:.2f}"),
        *((f"idle RSS {name} (MiB)", f"{value:.0f}") for name, value in mem["idleRssMiB"].items()),
        ("idle RSS etcd+apiserver+scheduler+KCM (MiB)", f"{mem['idleRssTotalMiB']:.0f}"),
        ("extra apiserver on the shared etcd → Ready (s)",
         ", ".join(f"{s:.2f}" for s in mem["extraApiserverReadySeconds"])),
        ("RSS added per extra apiserver (MiB)", str(mem["rssPerExtraApiserverMiB"])),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"controlplane-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
