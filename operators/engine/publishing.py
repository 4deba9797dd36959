"""The DRA half of the fake kubelet's GPU plugin: the executor of
:func:`operators.engine.devices.plan`, and GPUs taken out of service and back.

One list and watch of the engine's own ResourceSlices (``fieldSelector=spec.driver=
gpu.fakefleet.dev``) keeps :attr:`Publisher.slices`; a restarted engine plans from what it
shows, so it adopts the slices that exist and writes only those whose digest differs from what
the node should publish. Slices are written after their nodes, in the engine's reconcile loop
(after the node writes of the same round) and through a gate of their own: once per node at
creation, again only when the pool's GPUs change, never on a heartbeat. Every outcome is
committed from the API's answer: a slice is known as written once its POST or PATCH answered,
forgotten once its DELETE did (or found it gone). A slice a Node owned before the node was made
again under its name is deleted and written anew; the garbage collector would take it anyway.

The DeviceClass ``gpu.fakefleet.dev`` is created once a pool publishes devices (AlreadyExists
is success: it is the same class). A member API server without ``resource.k8s.io/v1``
(Kubernetes before 1.34) serves no slices: the pools that want them say so in their status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from operators.api.gpus import DEVICE_CLASS
from operators.api.nodepools import FakeNodePoolSpec
from operators.engine import devices
from operators.engine.devices import SLICES, SliceFacts, Wanted
from operators.engine.inventory import NodeBook
from operators.engine.recording import EventRecorder
from operators.k8s import requests
from operators.k8s.client import Client
from operators.k8s.errors import Conflict, Invalid, K8sError, NotFound
from operators.k8s.retrying import Backoff
from operators.k8s.watching import list_and_watch
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

BURST = 100  # more slice writes than this at once load the API server
#: Writes of one slice that may meet a 409 in a row before a GPU's health change is retried
#: later (by its stage).
ATTEMPTS = 4
NOT_SERVED = ("the member API server does not serve resource.k8s.io/v1 (DRA, Kubernetes 1.34 "
              "or later), so its nodes cannot publish GPUs as devices: use gpu.allocation "
              "extended in this cluster")
TAINTS_DROPPED = ("the member API server dropped the device taints that take GPUs out of "
                  "service: it does not serve them (feature gate DRADeviceTaints, on by "
                  "default from Kubernetes 1.36), so those GPUs stay allocatable to new claims")
LISTING = ("waiting to list the member cluster's ResourceSlices (resource.k8s.io/v1) before "
           "publishing the nodes' GPUs as devices")

#: Which GPUs of a node are out of service, given its slice as last seen (None: there is none).
Choose = Callable[[SliceFacts | None], Mapping[int, devices.Taint]]


def _kept(found: SliceFacts | None) -> Mapping[int, devices.Taint]:
    """The GPUs a slice shows out of service stay out when it is written again."""
    return found.out if found is not None else {}


class Publisher:
    """ResourceSlices and the DeviceClass of one cluster's DRA nodes."""

    def __init__(self, cluster: str, client: Client, book: NodeBook, *, clock: Clock,
                 concurrency: int, on_change: Callable[[], None] = lambda: None,
                 recorder: EventRecorder | None = None) -> None:
        self.cluster = cluster
        self.client = client
        self._book = book
        self._recorder = recorder
        self._warned: set[str] = set()  # nodes told that their API server drops device taints
        self._clock = clock
        self._gate = asyncio.Semaphore(concurrency)
        self._on_change = on_change
        self.slices: dict[str, SliceFacts] = {}
        self.listed = asyncio.Event()
        self.served = True
        self.problems: dict[str, str] = {}  # per pool: why its nodes publish no devices
        self.busy = False
        self._desired: Mapping[str, FakeNodePoolSpec] = {}
        self._class_made = False

    # -- observing -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Learn whether the API serves slices, then keep :attr:`slices` as the API shows."""
        backoff = Backoff(cap=5.0)
        while True:
            try:
                await self.client.get(SLICES, {**devices.OWN_SLICES, "limit": "1"})
                break
            except NotFound:
                self.served = False
                self.listed.set()
                logger.warning("engine %s: %s", self.cluster, NOT_SERVED)
                return
            except K8sError as error:
                delay = backoff.next()
                logger.warning("engine %s: probing resource.k8s.io/v1 failed, retrying in "
                               "%.1fs: %s", self.cluster, delay, error)
                await self._clock.sleep(delay)
        await list_and_watch(self.client, SLICES, devices.OWN_SLICES, on_list=self._listed,
                             on_event=self._changed, clock=self._clock)

    def _listed(self, items: list[Any]) -> None:
        before = self.slices
        self.slices = {facts.name: facts for item in items
                       if (facts := devices.observe_slice(item)) is not None}
        first = not self.listed.is_set()
        self.listed.set()
        if first or before.keys() != self.slices.keys() or any(
                _differs(before[name], facts) for name, facts in self.slices.items()):
            self._on_change()

    def _changed(self, kind: str, obj: Any) -> None:
        facts = devices.observe_slice(obj)
        if facts is None:
            return
        known = self.slices.get(facts.name)
        if kind == "DELETED":
            if known is None or known.uid != facts.uid:
                return
            del self.slices[facts.name]
            self._on_change()  # deleted by someone else: written again if still wanted
            return
        self.slices[facts.name] = facts
        if known is None or _differs(known, facts):
            self._on_change()  # not the echo of our own write

    # -- reconciling ---------------------------------------------------------------------------

    async def reconcile(self, desired: Mapping[str, FakeNodePoolSpec]) -> bool:
        """Plan from the book and the slices, and apply; True when every action succeeded."""
        self._desired = desired
        publishing = {pool for pool, spec in desired.items() if spec.publishes_devices}
        if not self.listed.is_set():  # nothing to plan from yet; the list wakes the loop
            self.problems = dict.fromkeys(sorted(publishing), LISTING)
            return not publishing
        if not self.served:
            self.problems = dict.fromkeys(sorted(publishing), NOT_SERVED)
            return True  # nothing to retry until the pools change
        problems: dict[str, str] = {}
        if publishing and not self._class_made and not await self._make_class(problems,
                                                                             publishing):
            self.problems = problems
            return False
        actions = devices.plan(self.cluster, self._wanted(), self.slices)
        self.busy = len(actions) > BURST
        try:
            done = await self._gather(self._withdraw(a.name, a.uid) for a in actions
                                      if isinstance(a, devices.Withdraw))
            done &= await self._gather(self._publish(a.node, problems) for a in actions
                                       if isinstance(a, devices.Publish))
        finally:
            self.busy = False
            self.problems = problems
        return done

    def _wanted(self) -> list[Wanted]:
        wanted = []
        for name, record in self._book.records.items():
            spec = self._desired.get(record.pool)
            if spec is not None and spec.publishes_devices:
                wanted.append(Wanted(name, record.uid, record.pool, spec))
        return wanted

    def _want(self, node: str) -> Wanted | None:
        record = self._book.records.get(node)
        spec = self._desired.get(record.pool) if record is not None else None
        if record is None or spec is None or not spec.publishes_devices:
            return None
        return Wanted(node, record.uid, record.pool, spec)

    async def _make_class(self, problems: dict[str, str], pools: Iterable[str]) -> bool:
        try:
            await self.client.create(devices.DEVICE_CLASSES, devices.device_class(),
                                     decode=False)
        except Conflict as error:
            if not error.already_exists:
                return False
        except K8sError as error:
            logger.warning("engine %s: creating DeviceClass %s failed: %s", self.cluster,
                           DEVICE_CLASS, error)
            for pool in pools:
                problems[pool] = f"DeviceClass {DEVICE_CLASS} cannot be created yet: {error}"
            return False
        self._class_made = True
        return True

    async def _publish(self, node: str, problems: dict[str, str]) -> bool:
        want = self._want(node)
        if want is None:
            return True  # gone since the plan: the next one withdraws its slice
        try:
            await self._write(want, _kept)
        except Invalid as error:  # retrying cannot mend what the API server refuses
            problems[want.pool] = (f"the ResourceSlice of node {node} was refused: "
                                   f"{error.message}")
            return True
        except K8sError as error:
            logger.debug("engine %s: publishing the devices of %s failed: %s", self.cluster,
                         node, error)
            return False
        return True

    async def _withdraw(self, name: str, uid: str) -> bool:
        try:
            await self.client.delete(f"{SLICES}/{name}", body=requests.delete_options(uid=uid),
                                     decode=False)
        except (NotFound, Conflict):
            pass  # gone already, or a newer slice of that name that is not this one
        except K8sError as error:
            logger.debug("engine %s: withdrawing slice %s failed: %s", self.cluster, name, error)
            return False
        found = self.slices.get(name)
        if found is not None and found.uid == uid:
            del self.slices[name]
        return True

    # -- writing one slice ---------------------------------------------------------------------

    async def _write(self, want: Wanted, choose: Choose) -> None:
        """Bring the node's slice to ``want`` with the GPUs ``choose`` takes out of service
        (given the slice as last seen, None if there is none), from what the engine last saw
        of it: create it, patch it (conditional on its resourceVersion; after a 409 read again
        and computed anew), or replace one an earlier node of that name owned. Raises
        K8sError."""
        name = devices.slice_name(want.node)
        for _ in range(ATTEMPTS):
            found = self.slices.get(name)
            if found is not None and found.owner != want.uid:
                if not await self._withdraw(found.name, found.uid):
                    raise K8sError(f"slice {name} of an earlier node {want.node} could not be "
                                   f"deleted yet")
                found = None
            out = choose(found)
            if found is not None and found.digest == devices.digest(self.cluster, want, out):
                return
            try:
                if found is None:
                    body = devices.render_slice(self.cluster, want, out=out, generation=1)
                    written = await self.client.create(SLICES, body)
                else:
                    body = devices.render_slice(self.cluster, want, out=out,
                                                generation=found.generation + 1)
                    metadata = body["metadata"]
                    written = await self.client.patch(f"{SLICES}/{name}", {
                        "metadata": {"resourceVersion": found.resource_version,
                                     "labels": metadata["labels"],
                                     "annotations": metadata["annotations"]},
                        "spec": {"pool": body["spec"]["pool"],
                                 "devices": body["spec"]["devices"]}})
            except Conflict as error:  # made meanwhile, or changed: read it and compute again
                if found is None and not error.already_exists:
                    raise
                await self._reread(name)
                continue
            except NotFound:  # deleted meanwhile: create it
                self.slices.pop(name, None)
                continue
            self._record(written)
            stored = self.slices.get(name)
            if stored is not None and set(out) - set(stored.out):
                self._taints_dropped(want)
            return
        raise Conflict(409, "Conflict", f"slice {name} changed {ATTEMPTS} times while written")

    def _taints_dropped(self, want: Wanted) -> None:
        """The API server stored the slice without the taints it was sent: device taints are
        off there (feature gate DRADeviceTaints, alpha and off before Kubernetes 1.36), so a
        GPU out of service stays allocatable. Said once per node, in its Events."""
        if want.node in self._warned:
            return
        self._warned.add(want.node)
        logger.warning("engine %s: %s", self.cluster, TAINTS_DROPPED)
        if self._recorder is not None:
            self._recorder.emit(kind="Node", name=want.node, uid=want.uid,
                                event_type="Warning", reason="DeviceTaintsDropped",
                                message=TAINTS_DROPPED, host=want.node)

    async def _reread(self, name: str) -> None:
        try:
            self._record(await self.client.get(f"{SLICES}/{name}"))
        except NotFound:
            self.slices.pop(name, None)

    def _record(self, obj: Any) -> None:
        facts = devices.observe_slice(obj)
        if facts is not None:
            self.slices[facts.name] = facts

    # -- GPUs out of service -------------------------------------------------------------------

    async def set_gpu_health(self, node: str, indices: Sequence[int], *, healthy: bool,
                             reason: str) -> None:
        """Take the GPUs ``indices`` of ``node`` out of service (their devices tainted, so no
        new claim gets them and the pods using them are evicted), or put them back. A node
        that publishes no devices has nothing to change. Idempotent; raises K8sError when the
        write failed (the caller retries), never NotFound: the node is there."""
        want = self._want(node)
        if want is None or not self.served:
            return
        if not self.listed.is_set():  # which GPUs are out is not known yet
            raise K8sError(f"the ResourceSlices are not listed yet: {node} waits for them")

        def choose(found: SliceFacts | None) -> Mapping[int, devices.Taint]:
            return devices.with_health(found.out if found is not None else {}, indices,
                                       healthy=healthy, reason=reason,
                                       gpus=want.spec.gpus_per_node)

        await self._write(want, choose)

    async def _gather(self, calls: Iterable[Awaitable[bool]]) -> bool:
        async def gated(call: Awaitable[bool]) -> bool:
            async with self._gate:
                return await call

        results = await asyncio.gather(*(gated(call) for call in calls))
        return all(results)


def _differs(known: SliceFacts, seen: SliceFacts) -> bool:
    return (known.uid, known.owner, known.digest) != (seen.uid, seen.owner, seen.digest)

