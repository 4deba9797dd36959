"""What judging a CEL expectation in a worker process costs, beside evaluating it in-process:

    python -m bench.cel [--objects 1,100,1000] [--rounds 20] [--expression EXPR]

The operator never evaluates a user's CEL on its event loop (cel-python has no cost budget):
``operators.faults.evaluating.CelWorkers`` sends each judgement to a worker process. Measured
for each number of objects (Pods of about 2 KB, as a member lists them), as the median of
``--rounds`` judgements on a warm worker (started and with the expression compiled before the
clock starts):

- in-process: ``CelMatcher.matches`` on each object, what the operator did before;
- worker: ``CelWorkers.matches`` on the list (encoding, the pipe, the worker's decoding, its
  budget timer around each object, the answers);
- the overhead per object and per judgement, and the event loop's busy time per judgement
  (the encoding the operator still does, one object at a time);
- a worker's start (interpreter, cel-python, its parser) and its RSS once warm.

Results also go to ``bench/results/cel-<time>.json`` (git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from bench.engines import RESULTS
from bench.terminating import sigterm_interrupts
from operators.faults.cel import CelMatcher
from operators.faults.evaluating import CelWorkers

EXPRESSION = "self.status.phase == 'Running' && self.status.containerStatuses.all(c, c.ready)"


def pod(index: int) -> dict[str, Any]:
    """A Pod about as large as a member lists one (about 2 KB of JSON)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"train-{index}", "namespace": "default", "uid": f"{index:032x}",
                     "labels": {"app": "train", "fakefleet.dev/pool": "h100",
                                "batch.kubernetes.io/job-name": "train"},
                     "annotations": {"fakefleet.dev/run-time": "60s"},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                          "name": "train", "uid": "0" * 32,
                                          "controller": True}]},
        "spec": {"nodeName": f"h100-{index % 50}", "containers": [{
            "name": "main", "image": "registry.example/train:1",
            "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
        "status": {"phase": "Running", "podIP": f"10.0.{index // 250}.{index % 250}",
                   "conditions": [{"type": kind, "status": "True"} for kind in (
                       "PodScheduled", "Initialized", "ContainersReady", "Ready")],
                   "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                          "state": {"running": {
                                              "startedAt": "2026-12-01T00:00:00Z"}}}]},
    }


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class LoopBusy:
    """How long the event loop was busy in callbacks (not waiting) while a coroutine ran."""

    def __init__(self) -> None:
        self.busy = 0.0

    async def measure(self, coroutine: Any) -> Any:
        loop = asyncio.get_running_loop()
        select = loop._selector.select  # type: ignore[attr-defined]
        marks = {"out": time.perf_counter()}

        def timed(timeout: float | None) -> Any:
            self.busy += time.perf_counter() - marks["out"]
            try:
                return select(timeout)
            finally:
                marks["out"] = time.perf_counter()

        loop._selector.select = timed  # type: ignore[attr-defined]
        try:
            return await coroutine
        finally:
            loop._selector.select = select  # type: ignore[attr-defined]


async def bench(expression: str, counts: list[int], rounds: int) -> dict[str, Any]:
    matcher = CelMatcher(expression)
    workers = CelWorkers()
    try:
        began = time.perf_counter()
        await workers.matches(expression, [pod(0)])
        start = time.perf_counter() - began
        rows = []
        for count in counts:
            objects = [pod(index) for index in range(count)]
            local, remote, busy = [], [], []
            for _ in range(rounds):
                began = time.perf_counter()
                expected = [matcher.matches(obj) for obj in objects]
                local.append(time.perf_counter() - began)
                meter = LoopBusy()
                began = time.perf_counter()
                answered = await meter.measure(workers.matches(expression, objects))
                remote.append(time.perf_counter() - began)
                busy.append(meter.busy)
                assert answered == expected, "the worker answered otherwise"
            in_process, worker = statistics.median(local), statistics.median(remote)
            rows.append({
                "objects": count,
                "in_process_ms": round(in_process * 1000, 3),
                "worker_ms": round(worker * 1000, 3),
                "overhead_ms_per_judgement": round((worker - in_process) * 1000, 3),
                "overhead_us_per_object": round((worker - in_process) / count * 1e6, 1),
                "loop_busy_ms": round(statistics.median(busy) * 1000, 3),
            })
        (pid,) = [worker.process.pid for worker in workers._idle]
        return {"expression": expression, "rounds": rounds,
                "worker_start_s": round(start, 3), "worker_rss_mib": round(rss_mib(pid), 1),
                "rows": rows}
    finally:
        await workers.close()


def main() -> None:
    sigterm_interrupts()
    parser = argparse.ArgumentParser(prog="python -m bench.cel", description=__doc__)
    parser.add_argument("--objects", default="1,100,1000",
                        help="comma-separated numbers of objects per judgement")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--expression", default=EXPRESSION)
    args = parser.parse_args()
    counts = [int(count) for count in args.objects.split(",")]
    result = asyncio.run(bench(args.expression, counts, args.rounds))
    print(f"worker start {result['worker_start_s']} s, warm RSS {result['worker_rss_mib']} MiB")
    header = ("objects", "in_process_ms", "worker_ms", "overhead_ms_per_judgement",
              "overhead_us_per_object", "loop_busy_ms")
    print(" | ".join(header))
    for row in result["rows"]:
        print(" | ".join(str(row[key]) for key in header))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"cel-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results in {out}")


if __name__ == "__main__":
    main()
