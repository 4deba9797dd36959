"""Simulated usage of one cluster's pods and nodes, measured when a scrape asks: no timer per
pod, no API write, nothing but what the engine already knows of its pods.

A pod's usage comes from its annotations, else from its pool's defaults (``spec.usage``)::

    fakefleet.dev/usage-cpu: 250m                 cores, or a profile: ramp(100m, 2, 5m)
    fakefleet.dev/usage-memory: 1Gi               bytes (working set), or a profile
    fakefleet.dev/usage-gpu-util: "85"            percent, for each GPU the pod holds
    fakefleet.dev/usage-gpu-memory: "60"          percent of each held GPU's memory

(:mod:`operators.api.usage` has the syntax). A pod's usage is split over its containers in
proportion to their requests (evenly when they request nothing). A node uses its own amount
(``spec.usage.node``, counted from the node's creation) plus its running pods'.

A pod's application metrics, its ``fakefleet.dev/metric.<name>`` annotations
(:mod:`operators.api.appmetrics`), are measured here too, in the same syntax and from the same
start, for the pod's metrics endpoint at its node: gauges, so a change of annotation takes
effect at once, with nothing to carry over.

CPU is a counter of core-seconds. A change of annotation carries the counter over: what the
container used until the change is kept, and the new profile counts from then on, so the
counter never runs backwards and the rate metrics-server computes between two scrapes is
exactly the mean of the profiles in force. A container that restarts counts from zero again, as
a new container does; what a node's containers used before they stopped stays in the node's
counter. An engine that restarts knows none of that history: it counts each running container as
if its current profile had held since it started, and a node from its creation with its current
pods, so a counter that was carried or retired can read lower once, which metrics-server skips.

GPUs: a pod that is bound and not finished holds the GPUs it requests (``nvidia.com/gpu``), as
the device plugin allocates them: the lowest free indices that are in service, when the engine
first sees the pod hold them, and the same ones until it stops. They are busy while its
containers run; a GPU nobody holds idles.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator

from operators.api import appmetrics, usage
from operators.api.gpus import PRESETS, gpu_uuid
from operators.api.nodepools import FakeNodePoolSpec
from operators.api.usage import Profile
from operators.engine import pods as podlife
from operators.engine.nodes import NodeLife
from operators.engine.pods import PodFacts, PodLife
from operators.k8s.times import parse
from operators.metrics.application import ApplicationSample
from operators.metrics.dcgm import GPUSample, Holder
from operators.metrics.kubelet import ContainerSample, NodeSample, PodSample
from primitives import keys

#: Each annotation, and the kind of amount it holds.
ANNOTATIONS: dict[str, usage.Kind] = {
    keys.USAGE_CPU: "cpu", keys.USAGE_MEMORY: "memory",
    keys.USAGE_GPU_UTIL: "percent", keys.USAGE_GPU_MEMORY: "percent",
}


@dataclasses.dataclass(frozen=True)
class Defaults:
    """A pool's usage defaults, parsed once per pool spec."""

    node_cpu: Profile
    node_memory: Profile
    cpu: Profile
    memory: Profile
    gpu_util: Profile
    gpu_memory: Profile

    @classmethod
    def of(cls, spec: FakeNodePoolSpec) -> Defaults:
        given = spec.usage
        return cls(usage.parse(given.node.cpu, "cpu"), usage.parse(given.node.memory, "memory"),
                   usage.parse(given.pod.cpu, "cpu"), usage.parse(given.pod.memory, "memory"),
                   usage.parse(given.gpu.utilization, "percent"),
                   usage.parse(given.gpu.memory, "percent"))


NO_USAGE = Profile.constant(0.0)
#: A node whose pool is not known (being deleted): it reports its pods and nothing of its own.
IDLE = Defaults(NO_USAGE, NO_USAGE, NO_USAGE, NO_USAGE, NO_USAGE, NO_USAGE)


class Meter:
    """One pod: its facts and committed life, its annotated profiles (None: the pool's), its
    CPU counter's carry, and the GPU indices it holds."""

    __slots__ = ("anchor", "base", "cpu", "declared", "facts", "gpu_memory", "gpu_util", "gpus",
                 "life", "memory", "metrics", "since", "started", "texts")

    def __init__(self, facts: PodFacts, life: PodLife) -> None:
        self.facts = facts
        self.life = life
        self.started = _started(life)
        self.texts: tuple[str | None, ...] = (None, None, None, None)
        self.cpu: Profile | None = None
        self.memory: Profile | None = None
        self.gpu_util: Profile | None = None
        self.gpu_memory: Profile | None = None
        #: Its application metrics' annotations, and the metrics they declare.
        self.declared: appmetrics.Declared = ()
        self.metrics: appmetrics.Metrics = ()
        #: The carry: core-seconds used by the container started at ``since`` until
        #: ``anchor``, when the profile in force changed.
        self.since = 0.0
        self.anchor = 0.0
        self.base = 0.0
        self.gpus: tuple[int, ...] | None = None  # None: not allocated yet

    def cpu_seconds(self, now: float, profile: Profile) -> float:
        """Core-seconds the running container used since it started."""
        started = self.started
        if started is None:
            return 0.0
        if started != self.since:  # no carry for this container
            return profile.integral(0.0, elapsed(now, started))
        return self.base + profile.integral(elapsed(self.anchor, started), elapsed(now, started))


def elapsed(now: float, since: float) -> float:
    """Seconds from ``since`` to ``now``, both seconds since the epoch, to the millisecond.

    A float near today's epoch (1.8e9) resolves about 0.24 µs, so a plain difference is off by
    that much, differently at every scrape: metrics-server's rates then came out a few
    nanocores above or below the profile (350000005n), and kubectl top, rounding up, showed
    351m for 350m. Samples are stamped in whole milliseconds; to the millisecond, every
    counter's increase over a window is the profile's exact integral.
    """
    return round((now - since) * 1000) / 1000


def _started(life: PodLife) -> float | None:
    """When the running containers started (None: they are not running)."""
    if life.phase != podlife.RUNNING or not life.started_at:
        return None
    return parse(life.started_at)


class UsageBook:
    """Usage of every pod the engine runs, and of its nodes, computed at scrape time."""

    def __init__(self, *, pool_of: Callable[[str], tuple[str, FakeNodePoolSpec] | None],
                 created: Callable[[str], str]) -> None:
        """``pool_of``: the pool of a node and its spec (None: none); ``created``: a node's
        creationTimestamp."""
        self._pool_of = pool_of
        self._created = created
        self._meters: dict[str, Meter] = {}
        self._by_node: dict[str, dict[str, Meter]] = {}
        #: Core-seconds of containers that stopped, per node that exists.
        self._retired: dict[str, float] = {}
        #: Per pool, the spec its defaults were parsed from, and them.
        self._defaults: dict[str, tuple[FakeNodePoolSpec, Defaults]] = {}
        #: Per node, a number that changes whenever its pods do (:meth:`version`).
        self._versions: dict[str, int] = {}
        self._changes = itertools.count(1)

    def __len__(self) -> int:
        return len(self._meters)

    def version(self, node: str) -> int:
        """A number that changes whenever what the node's pods report may have: a pod seen,
        gone, started or stopped, or its usage annotations changed. Time aside, a node's
        sample is the same while this is."""
        return self._versions.get(node, 0)

    def _changed(self, node: str) -> None:
        self._versions[node] = next(self._changes)

    # -- what the pod half tells ------------------------------------------------------------

    def seen(self, facts: PodFacts, life: PodLife, now: float) -> tuple[str, ...]:
        """A pod the engine runs from now on; the problems of its usage annotations."""
        meter = Meter(facts, life)
        self._meters[facts.uid] = meter
        self._by_node.setdefault(facts.node, {})[facts.uid] = meter
        self._changed(facts.node)
        return self._read(meter, now)

    def annotated(self, uid: str, now: float) -> tuple[str, ...]:
        """The pod's annotations may have changed; the problems of those that did."""
        meter = self._meters.get(uid)
        return self._read(meter, now) if meter is not None else ()

    def lived(self, uid: str, life: PodLife, now: float) -> None:
        """The pod's new life is committed: a container that stopped retires its counter."""
        meter = self._meters.get(uid)
        if meter is None:
            return
        started = _started(life)
        if meter.started is not None and started != meter.started:
            self._retire(meter, now)
        meter.life, meter.started = life, started
        self._changed(meter.facts.node)
        if life.phase in podlife.TERMINAL:
            meter.gpus = ()  # a finished pod's devices are free again

    def gone(self, uid: str, now: float) -> None:
        meter = self._meters.pop(uid, None)
        if meter is None:
            return
        if meter.started is not None:
            self._retire(meter, now)
        self._changed(meter.facts.node)
        on_node = self._by_node.get(meter.facts.node)
        if on_node is not None:
            on_node.pop(uid, None)
            if not on_node:
                del self._by_node[meter.facts.node]

    def node_gone(self, node: str) -> None:
        """``node`` was deleted: what its stopped containers used goes with it (a node made
        again under its name starts its counters anew, as a new kubelet's do)."""
        self._retired.pop(node, None)

    def _retire(self, meter: Meter, now: float) -> None:
        node = meter.facts.node
        if not self._created(node):
            return  # the node is gone (its pods may go after it): nothing counts for it
        cpu = meter.cpu or self.defaults(node).cpu
        self._retired[node] = self._retired.get(node, 0.0) + meter.cpu_seconds(now, cpu)

    def _read(self, meter: Meter, now: float) -> tuple[str, ...]:
        annotations = meter.facts.annotations
        texts = tuple(annotations.get(key) for key in ANNOTATIONS)
        declared = appmetrics.declared(annotations)
        problems: list[str] = []
        if declared != meter.declared:
            problems += self._read_metrics(meter, declared)
        if texts == meter.texts:
            return tuple(problems)
        parsed: list[Profile | None] = []
        for (key, kind), text, old in zip(ANNOTATIONS.items(), texts, meter.texts,
                                          strict=True):
            if text is None:
                parsed.append(None)
                continue
            try:
                parsed.append(usage.parse(text, kind))
            except ValueError as error:
                parsed.append(None)
                if text != old:
                    problems.append(f"annotation {key} ignored: {error}")
        cpu = parsed[0]
        if cpu != meter.cpu and meter.started is not None:
            # Carried over: the new profile counts from now on.
            meter.base = meter.cpu_seconds(now, meter.cpu or self.defaults(meter.facts.node).cpu)
            meter.since, meter.anchor = meter.started, now
        meter.texts = texts
        meter.cpu, meter.memory, meter.gpu_util, meter.gpu_memory = parsed
        self._changed(meter.facts.node)
        return tuple(problems)

    @staticmethod
    def _read_metrics(meter: Meter, declared: appmetrics.Declared) -> list[str]:
        """The pod's application metrics anew; the problems of annotations that changed."""
        before, texts = dict(meter.declared), dict(declared)
        meter.metrics, problems = appmetrics.parse(declared)
        meter.declared = declared
        return [f"annotation {key} ignored: {problem}" for key, problem in problems.items()
                if before.get(key) != texts[key]]

    def defaults(self, node: str) -> Defaults:
        found = self._pool_of(node)
        if found is None:
            return IDLE
        pool, spec = found
        cached = self._defaults.get(pool)
        if cached is None or cached[0] is not spec:
            cached = (spec, Defaults.of(spec))
            self._defaults[pool] = cached
        return cached[1]

    # -- what a scrape asks -------------------------------------------------------------------

    def node_sample(self, node: str, now: float) -> NodeSample:
        """The node's kubelet resource metrics at ``now``."""
        at = int(now * 1000)
        now = at / 1000  # what each counter is computed for is the time it is stamped with
        defaults = self.defaults(node)
        created = self._created(node)
        uptime = elapsed(now, parse(created)) if created else 0.0
        cpu = defaults.node_cpu.integral(0.0, uptime) + self._retired.get(node, 0.0)
        memory = defaults.node_memory.at(uptime)
        pods: list[PodSample] = []
        for meter in self._by_node.get(node, {}).values():
            sample = self._pod_sample(meter, defaults, now)
            if sample is not None:
                pods.append(sample)
                cpu += sum(c.cpu_seconds for c in sample.containers)
                memory += sum(c.memory_bytes for c in sample.containers)
        return NodeSample(at, cpu, memory, pods)

    def _pod_sample(self, meter: Meter, defaults: Defaults, now: float) -> PodSample | None:
        started = meter.started
        if started is None:
            return None
        facts = meter.facts
        cpu = meter.cpu_seconds(now, meter.cpu or defaults.cpu)
        memory = (meter.memory or defaults.memory).at(elapsed(now, started))
        resources = facts.resources
        cpu_shares = _shares([r.cpu for r in resources])
        memory_shares = _shares([r.memory for r in resources])
        containers = tuple(
            ContainerSample(name, cpu * cpu_share, memory * memory_share, started)
            for (name, _), cpu_share, memory_share in zip(facts.containers, cpu_shares,
                                                          memory_shares, strict=True))
        return PodSample(facts.namespace, facts.name, containers)

    def application_sample(self, node: str, namespace: str, name: str,
                           now: float) -> ApplicationSample | None:
        """The application metrics of the pod ``namespace/name`` at ``now``; None when no
        such pod runs on ``node`` (its containers have not started, or have stopped)."""
        for meter in self._by_node.get(node, {}).values():
            facts = meter.facts
            if facts.name != name or facts.namespace != namespace:
                continue
            if meter.started is None:
                return None
            running = elapsed(now, meter.started)
            return ApplicationSample(
                namespace, name, facts.containers[0][0] if facts.containers else "",
                tuple((metric, profile.at(running)) for metric, profile in meter.metrics))
        return None

    def gpu_samples(self, cluster: str, node: str, spec: FakeNodePoolSpec, life: NodeLife,
                    now: float) -> Iterator[GPUSample]:
        """The GPUs of one node at ``now``: who holds each and how busy it is."""
        assert spec.gpu is not None
        preset = spec.gpu.preset
        count = spec.gpus_per_node
        memory = PRESETS[preset].memory_mib
        holders = self._allocate(node, count, life)
        defaults = self.defaults(node)
        for index in range(count):
            state = life.gpu(index)
            sample = GPUSample(node=node, index=index, uuid=gpu_uuid(cluster, node, index),
                               product=preset, memory_mib=memory, xid=state.xid,
                               healthy=state.healthy, temperature=state.temperature,
                               sm_clock=state.sm_clock)
            held = holders.get(index)
            if held is not None:
                meter, container = held
                sample = dataclasses.replace(sample, holder=Holder(
                    meter.facts.namespace, meter.facts.name, container))
                if meter.started is not None:
                    running = elapsed(now, meter.started)
                    sample = dataclasses.replace(
                        sample,
                        utilization=(meter.gpu_util or defaults.gpu_util).at(running),
                        memory_used=(meter.gpu_memory or defaults.gpu_memory).at(running))
            yield sample

    def held(self, uid: str, count: int, life: NodeLife) -> dict[str, tuple[int, ...]]:
        """The GPUs (indices on its node) each container of pod ``uid`` holds, allocated as a
        scrape allocates them, so ``nvidia-smi -L`` in the container and the DCGM series name
        the same GPUs; ``count``: the node's GPUs."""
        meter = self._meters.get(uid)
        if meter is None:
            return {}
        held: dict[str, tuple[int, ...]] = {}
        for index, (holder, container) in sorted(
                self._allocate(meter.facts.node, count, life).items()):
            if holder is meter:
                held[container] = (*held.get(container, ()), index)
        return held

    def _allocate(self, node: str, count: int,
                  life: NodeLife) -> dict[int, tuple[Meter, str]]:
        """Index → (pod, container) of the node's GPUs now held; pods new to holding get the
        lowest free indices in service, in the order they were bound."""
        holders: dict[int, tuple[Meter, str]] = {}
        waiting: list[Meter] = []
        for meter in self._by_node.get(node, {}).values():
            if meter.life.phase in podlife.TERMINAL or not any(
                    r.gpus for r in meter.facts.resources):
                continue
            if meter.gpus is None:
                waiting.append(meter)
                continue
            self._hold(holders, meter, meter.gpus)
        waiting.sort(key=lambda m: (m.facts.scheduled_at, m.facts.namespace, m.facts.name))
        for meter in waiting:
            wanted = sum(r.gpus for r in meter.facts.resources)
            free = [index for index in range(count)
                    if index not in holders and life.gpu(index).healthy]
            meter.gpus = tuple(free[:wanted])
            self._hold(holders, meter, meter.gpus)
        return holders

    @staticmethod
    def _hold(holders: dict[int, tuple[Meter, str]], meter: Meter,
              indices: Iterable[int]) -> None:
        """Record ``indices`` as the pod's, each with the container that asked for it."""
        owners = [name for (name, _), asked in zip(meter.facts.containers,
                                                   meter.facts.resources, strict=True)
                  for _ in range(asked.gpus)]
        for index, container in zip(indices, owners, strict=False):
            holders.setdefault(index, (meter, container))


def _shares(amounts: list[float]) -> list[float]:
    """Each amount's part of the whole (even parts when they are all 0)."""
    total = sum(amounts)
    if total <= 0:
        return [1 / len(amounts)] * len(amounts) if amounts else []
    return [amount / total for amount in amounts]

