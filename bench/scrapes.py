"""What one scrape round of every node costs the engine, in-process, without a control plane:

    python -m bench.scrapes [--nodes 5000] [--gpu-nodes 1000] [--pods 10000] [--rounds 5]
                            [--scrapes 6000] [--concurrency 64]

The engine's own usage book and body cache (:mod:`operators.engine.usage`,
:mod:`operators.engine.caching`) hold the workload of ``bench.usage``: ``--nodes`` CPU nodes with
``--pods`` running pods round-robin, half of them with a usage profile, and ``--gpu-nodes`` H100
nodes with one 8-GPU pod each. Measured in CPU time of this process (wall time on a shared
machine says more about the others), as the median of ``--rounds`` rounds over every node:

- render per request: each node's sample taken and rendered for each scrape (what the engine
  did before the cache), in µs per node;
- first scrape in a bucket: through the cache, what each of metrics-server's scrapes costs (it
  asks each node once per round);
- repeat in the bucket: a second scraper of the same node within the same second.

Then the serving path: the engine's :class:`~operators.engine.serving.KubeletServer` on a free
port, ``--scrapes`` GETs of ``/metrics/resource`` at the nodes' own loopback addresses from a
client in another process, ``--concurrency`` at a time, each on a new connection (as
metrics-server's client opens all but 100 of them each round) and then on kept connections:
the engine's CPU time per scrape, end to end: accepting, parsing, each node's body rendered
once per second as the engine does, answering.

Results also go to ``bench/results/scrapes-<time>.json`` (git-ignored). CPU time, too, grows
on a busy machine (caches, frequency): compare figures taken at the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

from bench.engines import RESULTS
from bench.terminating import sigterm_interrupts
from operators.api.nodepools import FakeNodePoolSpec
from operators.engine import nodes as nodes_
from operators.engine import pods as podlife
from operators.engine.caching import Bodies
from operators.engine.pods import PodFacts, PodLife
from operators.engine.serving import KubeletServer
from operators.engine.usage import UsageBook
from operators.k8s.times import rfc3339
from operators.metrics import kubelet
from primitives.clocks import SYSTEM_CLOCK

PROFILE = {"fakefleet.dev/usage-cpu": "sine(100m, 900m, 2m)",
           "fakefleet.dev/usage-memory": "256Mi"}
CPU = FakeNodePoolSpec.model_validate({"clusterRef": "bench"})
#: The cache's bucket when a round is timed (s): longer than any round, so the repeat scrapes
#: fall in the bucket of the first ones.
ROUND_BUCKET = 3600.0
GPU = FakeNodePoolSpec.model_validate({"clusterRef": "bench",
                                       "gpu": {"preset": "H100-SXM5-80GB"}})


class Fleet:
    """The nodes and pods of ``bench.usage``, as the engine's usage book holds them."""

    def __init__(self, args: argparse.Namespace) -> None:
        started = time.time() - 3600
        created = rfc3339(started)  # the engine reads a node's creationTimestamp as it is
        self.nodes = [f"cpu-{i}" for i in range(args.nodes)] + \
            [f"h100-{i}" for i in range(args.gpu_nodes)]
        self.addresses = {nodes_.node_ip(slot): name for slot, name in enumerate(self.nodes)}
        self.book = UsageBook(
            pool_of=lambda node: ("cpu", CPU) if node.startswith("cpu-") else ("h100", GPU),
            created=lambda node: created)
        running = PodLife(phase=podlife.RUNNING, started_at=rfc3339(started + 60))
        for index in range(args.pods):
            self._pod(f"bench-{index}", f"cpu-{index % args.nodes}",
                      PROFILE if index % 2 == 0 else {}, running)
        for index in range(args.gpu_nodes):
            self._pod(f"train-{index}", f"h100-{index}", PROFILE, running, gpus=8)
        self.bodies = Bodies(self.render, clock=SYSTEM_CLOCK)

    def _pod(self, name: str, node: str, annotations: dict[str, str], life: PodLife, *,
             gpus: int = 0) -> None:
        container: dict[str, Any] = {"name": "c", "image": "fake"}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
        facts = PodFacts({"metadata": {"uid": name, "namespace": "default", "name": name,
                                       "annotations": annotations},
                          "spec": {"nodeName": node, "containers": [container]}})
        self.book.seen(facts, life, time.time())

    def render(self, node: str, now: float) -> bytes:
        return kubelet.render(self.book.node_sample(node, now)).encode()

    # -- serving.Source ---------------------------------------------------------------------

    def node_at(self, address: str) -> str | None:
        return self.addresses.get(address)

    def resource_metrics(self, node: str) -> bytes:
        return self.bodies.get(node, self.book.version(node))

    def dcgm_metrics(self) -> bytes:
        return b""

    def pod_metrics(self, node: str, namespace: str, name: str) -> bytes | None:
        return None


def per_node(fleet: Fleet, rounds: int) -> dict[str, float]:
    """µs per node of each way to answer a scrape, the median of ``rounds`` rounds."""
    uncached: list[float] = []
    first: list[float] = []
    repeat: list[float] = []
    count = len(fleet.nodes)
    for _ in range(rounds):
        started = time.process_time()
        for node in fleet.nodes:
            fleet.render(node, time.time())
        uncached.append(time.process_time() - started)
        # A bucket as long as the round takes, however slow the machine: a round is one bucket.
        bodies = Bodies(fleet.render, clock=SYSTEM_CLOCK, bucket=ROUND_BUCKET)
        started = time.process_time()
        for node in fleet.nodes:
            bodies.get(node, fleet.book.version(node))
        first.append(time.process_time() - started)
        started = time.process_time()
        for node in fleet.nodes:
            bodies.get(node, fleet.book.version(node))
        repeat.append(time.process_time() - started)
    return {name: statistics.median(seconds) / count * 1e6
            for name, seconds in (("render per request", uncached),
                                  ("first scrape in a bucket", first),
                                  ("repeat in the bucket", repeat))}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def serving(fleet: Fleet, args: argparse.Namespace) -> dict[str, float]:
    """The engine's CPU µs per scrape, on new connections and on kept ones."""
    server = KubeletServer(fleet)
    port = await server.start()
    results: dict[str, float] = {}
    try:
        for mode in ("new", "kept"):
            client = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.scrapes", "--client", str(port), mode,
                str(args.scrapes), str(args.concurrency), str(len(fleet.nodes)),
                stdout=asyncio.subprocess.PIPE)
            assert client.stdout is not None
            await client.stdout.readline()  # its connections are open (kept) and it starts
            before = cpu_seconds()
            if await client.wait() != 0:
                raise SystemExit(f"the scraping client failed ({mode} connections)")
            results[f"serving, {mode} connections"] = \
                (cpu_seconds() - before) / args.scrapes * 1e6
    finally:
        await server.close()
    return results


async def scrape(port: int, mode: str, count: int, concurrency: int, nodes: int) -> None:
    """The client: ``count`` GETs over the first ``nodes`` node addresses."""
    addresses = [nodes_.node_ip(slot) for slot in range(nodes)]
    kept: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    queue = iter(range(count))
    failures = 0

    async def get(address: str) -> None:
        connection = kept.pop(address, None) if mode == "kept" else None
        if connection is None:
            connection = await asyncio.open_connection(address, port)
        reader, writer = connection
        writer.write(f"GET /metrics/resource HTTP/1.1\r\nHost: {address}:{port}\r\n"
                     f"User-Agent: bench\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        await reader.readexactly(length)
        if mode == "kept":
            kept[address] = connection
        else:
            writer.close()

    async def worker() -> None:
        nonlocal failures
        for index in queue:
            try:
                await get(addresses[index % len(addresses)])
            except (OSError, asyncio.IncompleteReadError, StopIteration):
                failures += 1
    if mode == "kept":  # every connection opened before the clock counts
        for index in range(min(count, len(addresses))):
            await get(addresses[index])
    print("ready", flush=True)
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    for _, writer in kept.values():
        writer.close()
    if failures:
        raise SystemExit(f"{failures} of {count} scrapes failed")


def main() -> None:
    if sys.argv[1:2] == ["--client"]:
        port, mode, count, concurrency, nodes = sys.argv[2:7]
        asyncio.run(scrape(int(port), mode, int(count), int(concurrency), int(nodes)))
        return
    sigterm_interrupts()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpu-nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if args.nodes < 1 or args.rounds < 1 or args.scrapes < 1 or args.concurrency < 1:
        parser.error("--nodes, --rounds, --scrapes and --concurrency: at least 1 each")
    fleet = Fleet(args)
    figures = per_node(fleet, args.rounds)
    figures.update(asyncio.run(serving(fleet, args)))
    size = len(fleet.resource_metrics(fleet.nodes[0]))
    print(f"{len(fleet.nodes)} nodes, {len(fleet.book)} pods, {size} bytes a node, "
          f"load average {' '.join(f'{load:.1f}' for load in os.getloadavg())}")
    for name, micros in figures.items():
        print(f"  {name:<34} {micros:8.1f} µs a scrape "
              f"({micros * len(fleet.nodes) / 1e6:.2f} s of CPU a round)")
    payload = {"nodes": args.nodes, "gpuNodes": args.gpu_nodes, "pods": args.pods,
               "rounds": args.rounds, "scrapes": args.scrapes,
               "concurrency": args.concurrency, "bytes": size, "loadavg": os.getloadavg(),
               "microsecondsPerScrape": figures}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"scrapes-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
