"""``python -m operators.engine``: one engine against any cluster, without the operator.

    python -m operators.engine --kubeconfig member.kubeconfig --pool cpu=100 \
        --pool gpu=8:H100-SXM5-80GB

Useful to simulate nodes in a cluster that fakefleet did not create, and what the benchmark
runs (so its memory and CPU are the engine's alone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path

from operators.api.nodepools import FakeNodePoolSpec
from operators.engine.running import ClusterEngine, EngineSettings
from operators.k8s.client import Client
from operators.k8s.config import load_kubeconfig


def parse_pool(text: str, grace_cap: str) -> tuple[str, FakeNodePoolSpec]:
    """``NAME=REPLICAS[:GPU_PRESET]`` → a pool spec (validated like the CRD)."""
    name, _, rest = text.partition("=")
    replicas, _, preset = rest.partition(":")
    if not name or not replicas.isdigit():
        raise argparse.ArgumentTypeError(
            f"--pool {text!r}: expected NAME=REPLICAS or NAME=REPLICAS:GPU_PRESET, e.g. cpu=100")
    spec: dict[str, object] = {"clusterRef": "-", "replicas": int(replicas),
                               "pods": {"terminationGracePeriodCap": grace_cap}}
    if preset:
        spec["gpu"] = {"preset": preset}
    return name, FakeNodePoolSpec.model_validate(spec)


async def serve(kubeconfig: Path, pools: list[tuple[str, FakeNodePoolSpec]],
                settings: EngineSettings) -> None:
    # Requests in flight plus the two long watches (nodes, pods).
    client = Client(load_kubeconfig(kubeconfig.read_text()),
                    connections=settings.pod_concurrency + 2)
    engine = ClusterEngine(kubeconfig.stem, client, settings=settings)
    for name, spec in pools:
        engine.set_pool(name, spec)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    task = asyncio.create_task(engine.run())
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operators.engine", description=__doc__)
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--pool", action="append", default=[], metavar="NAME=REPLICAS[:GPU]")
    parser.add_argument("--grace-cap", default="1s",
                        help="longest a deleted pod waits before it is finalised")
    parser.add_argument("--concurrency", type=int, default=64,
                        help="requests in flight at once (one connection each)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        pools = [parse_pool(text, args.grace_cap) for text in args.pool]
    except (argparse.ArgumentTypeError, ValueError) as error:
        parser.error(str(error))
    settings = EngineSettings(concurrency=args.concurrency, pod_concurrency=args.concurrency)
    asyncio.run(serve(args.kubeconfig, pools, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
