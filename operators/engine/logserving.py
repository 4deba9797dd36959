"""The kubelet's ``/containerLogs/{namespace}/{pod}/{container}``: which run a request is for,
the kubelet's answers when there is none, and the run's lines (:mod:`operators.engine.logs`),
at once or followed.

A request is answered from what the engine keeps of the pod (its facts and committed life, the
status the API has from it): the pod must be on the node whose address the request came to,
as on a kubelet. The answer is chunked, as the kubelet's: the lines written by now (the window
the options ask for), a batch at a time while the connection takes them; with ``follow``, then
each line when it is written, until the run ends (the rest of its lines and its exit lines,
once the engine wrote its end) or the pod leaves the node. A follower waits in one delay queue
(:class:`~operators.engine.queues.DelayQueue`) for its next line, and is looked at again when
its pod's life changes; nothing runs for it in between.

A pod whose script (its annotation, the stages' ``logs`` section) does not cover the container
has an empty log, answered 200 as a kubelet answers a container that wrote nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import unquote

from operators.engine import logs
from operators.engine.dispatching import Dispatcher
from operators.engine.logs import NS, Context, Options, Refusal, Run, Script, Timeline
from operators.engine.pods import PodFacts, PodLife, render_status
from operators.engine.queues import DelayQueue
from operators.engine.responding import Answer
from operators.engine.stages import LogRule, log_script
from operators.engine.upgrading import Request
from operators.k8s.times import rfc3339
from primitives.clocks import Clock

logger = logging.getLogger(__name__)

#: Bytes written at once while the connection takes them (whole lines, more for a long one).
BATCH = 16 * 1024
#: How late (ns) a follower looks for a line after it is written.
LATE = 1000
#: A script that writes nothing: the log of a container no script covers.
EMPTY = Script(frozenset(), (), 0, 0, (), ())


class Pods(Protocol):
    """What the logs are made of: the engine's pods, and the scripts that apply to them."""

    def named(self, namespace: str, name: str) -> tuple[PodFacts, PodLife] | None:
        """The pod the engine runs under that name, and its committed life."""

    def log_rules(self, uid: str) -> Sequence[LogRule]:
        """The log scripts of the stages that apply to the pod."""


class Sink(Protocol):
    """Where a log's bytes go: the body of one answer."""

    @property
    def paused(self) -> bool:
        """Whether the connection takes no more for now (:meth:`LogStream.pump` once it does)."""

    def write(self, data: bytes) -> None: ...

    def end(self) -> None:
        """The body is complete."""


class LogServer:
    """Answers log requests, and keeps the followed ones going."""

    def __init__(self, pods: Pods, *, clock: Clock) -> None:
        self._pods = pods
        self._clock = clock
        self._due: DelayQueue[LogStream] = DelayQueue(clock)
        self._followed: dict[str, set[LogStream]] = {}  # by pod uid
        self._dispatcher: Dispatcher[LogStream] = Dispatcher(
            self._due, self._tick, clock=clock, limit=1, name="kubelet API: logs followed")

    async def run(self) -> None:
        """Write each followed line when it is due, until cancelled."""
        await self._dispatcher.run()

    def changed(self, uid: str) -> None:
        """The pod's life changed, or it is gone: its followers look again."""
        for stream in list(self._followed.get(uid, ())):
            self._tick(stream)

    def answer(self, request: Request, node: str) -> Answer | LogStream:
        """The answer to ``GET /containerLogs/...`` on ``node``."""
        names = [unquote(part) for part in request.path.split("/")[2:]]
        if len(names) != 3:
            return Answer(404, b"404 page not found\n")
        namespace, pod, container = names
        for missing, field in ((pod, "podID"), (container, "container name"),
                               (namespace, "podNamespace")):
            if not missing:
                return Answer(400, f'{{"message": "Missing {field}."}}'.encode())
        now = self._now()
        options = logs.parse_options(request.query, now)
        if isinstance(options, Refusal):
            return _refused(options)
        found = self._pods.named(namespace, pod)
        if found is None or found[0].node != node:
            return Answer(404, f'pod "{pod}" does not exist'.encode())
        facts, life = found
        if container not in {name for name, _ in facts.containers} | \
                {name for name, _, _ in facts.init_containers}:
            return Answer(404, f'container "{container}" not found in pod "{pod}"'.encode())
        stream = request.query.get("stream", ["All"])[0]
        if stream != "All":
            return Answer(400, f'unable to return the given log stream: "{stream}". Please '
                               f'enable PodLogsQuerySplitStreams feature gate in kubelet'
                               .encode())
        run = logs.run_of(render_status(facts, life, rfc3339(now / NS)), pod, container,
                          options.previous)
        if isinstance(run, Refusal):
            return _refused(run)
        script = log_script(self._pods.log_rules(facts.uid), facts, life, container) or EMPTY
        timeline = Timeline(script, run, _context(facts, container))
        begin, end = logs.window(timeline, options, now)
        return LogStream(self, facts.uid, (namespace, pod, container, node), timeline,
                         options, begin, end)

    # -- followers ------------------------------------------------------------------------------

    def _now(self) -> int:
        return round(self._clock.now() * NS)

    def follow(self, stream: LogStream, at: int | None) -> None:
        """Look at ``stream`` again at ``at`` (ns; None: only when its pod changes)."""
        self._followed.setdefault(stream.uid, set()).add(stream)
        if at is None:
            self._due.cancel(stream)
        else:
            # A microsecond late: the clock's float seconds are coarser than nanoseconds, and
            # read back a hair early the line would not count as written yet.
            self._due.schedule_at(stream, (at + LATE) / NS)
            self._dispatcher.wake()

    def forget(self, stream: LogStream) -> None:
        self._due.cancel(stream)
        followers = self._followed.get(stream.uid)
        if followers is not None:
            followers.discard(stream)
            if not followers:
                del self._followed[stream.uid]

    def _tick(self, stream: LogStream) -> None:
        try:
            stream.refresh(self._current(stream), self._now())
        except Exception:
            # A defect must not stop the other followers: this one ends.
            logger.exception("kubelet API: following the log of %s failed", "/".join(
                stream.names[:3]))
            stream.finish()

    def _current(self, stream: LogStream) -> Run | None:
        """The followed run as the pod shows it now (None: the pod left the node, or shows the
        run no more)."""
        namespace, pod, container, node = stream.names
        found = self._pods.named(namespace, pod)
        if found is None or found[0].uid != stream.uid or found[0].node != node:
            return None
        facts, life = found
        status = render_status(facts, life, rfc3339(self._clock.now()))
        return logs.run_again(status, container, stream.timeline.run)


class LogStream:
    """One answer to a log request: the window, then (``follow``) the lines as they come."""

    __slots__ = ("_begin", "_end", "_left", "_options", "_server", "_sink", "names",
                 "timeline", "uid")

    def __init__(self, server: LogServer, uid: str, names: tuple[str, str, str, str],
                 timeline: Timeline, options: Options, begin: int, end: int) -> None:
        """``names``: namespace, pod, container and node; ``begin``, ``end``: the positions
        of the lines written at once."""
        self._server = server
        self.uid = uid
        self.names = names
        self.timeline = timeline
        self._options = options
        self._begin, self._end = begin, end
        self._left = options.limit  # bytes still to write (None: no limit)
        self._sink: Sink | None = None

    def start(self, sink: Sink) -> None:
        self._sink = sink
        self.pump()

    def stop(self) -> None:
        """The connection is gone."""
        self._sink = None
        self._server.forget(self)

    def pump(self) -> None:
        """Write what is due while the connection takes it; then wait for the next line, or
        end."""
        sink = self._sink
        if sink is None:
            return
        while self._begin < self._end and not sink.paused:
            batch, reached = logs.take(self.timeline, self._begin, self._end,
                                       timestamps=self._options.timestamps, size=BATCH)
            if reached == self._begin:
                self._end = reached  # the run writes no more lines than these
                break
            self._begin = reached
            if self._left is not None:
                batch = batch[:self._left]
                self._left -= len(batch)
            sink.write(batch)
            if self._left == 0:
                self.finish()  # the limit is reached: the log ends mid-line, as the kubelet's
                return
        if self._begin < self._end:
            return  # paused: pumped again when the connection drains
        if not self._options.follow or self.timeline.ended:
            self.finish()
            return
        self._server.follow(self, self.timeline.time_at(self._begin))

    def refresh(self, run: Run | None, now: int) -> None:
        """Look again, at ``now``: the run as the pod shows it (None: the log ends here)."""
        if self._sink is None:
            return
        if run is None:
            self.finish()
            return
        if run.finished is not None and not self.timeline.ended:
            self.timeline = Timeline(self.timeline.script, run, self.timeline.context)
        self._end = self.timeline.count(now)
        if self._options.since is not None:
            self._begin = max(self._begin, min(self.timeline.first_since(self._options.since),
                                               self._end))
        self.pump()

    def finish(self) -> None:
        sink, self._sink = self._sink, None
        self._server.forget(self)
        if sink is not None:
            sink.end()


def _refused(refusal: Refusal) -> Answer:
    return Answer(refusal.status, refusal.text.encode())


def _context(facts: PodFacts, container: str) -> Context:
    names = [name for name, _ in facts.containers]
    gpus = facts.resources[names.index(container)].gpus if container in names else 0
    return Context(pod=facts.name, namespace=facts.namespace, container=container,
                   node=facts.node, gpus=gpus, labels=facts.labels,
                   annotations=facts.annotations,
                   seed=facts.seed or f"{facts.namespace}/{facts.name}")
