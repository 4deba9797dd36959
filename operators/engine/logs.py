"""Container logs, computed from a log script (:mod:`operators.api.logs`) and a run's times
whenever they are asked for, never stored. Pure: no I/O, no clock (``now`` comes in).

A run's log is a sequence of lines in time order: the script's start lines (at the run's start
plus their ``after``), its periodic lines (line n at start + n * interval, plus a jitter drawn
from the pod's seed), cut at the run's end, then its exit lines (at the end). A line written
by ``now`` stays where it is whatever happens later, so a log is addressed by *positions*:
:class:`Timeline` counts the lines written by any time and renders those between two
positions by index arithmetic, never materialising the thousands of periodic lines of a long
run. ``tailLines``, ``sinceSeconds``/``sinceTime`` and a follower's progress are positions.

Which run a request is about is the kubelet's own decision (``validateContainerLogStatus`` in
``pkg/kubelet/kubelet_pods.go`` at v1.36.3), made here on the container status the engine
reports (:func:`run_of`), with the kubelet's error texts; so is the parsing of the request's
options (:func:`parse_options`, the kubelet's ``getContainerLogs`` and the v1 validation).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

from operators.api.durations import parse_duration
from operators.api.logs import LogLines, Placeholder, Template, parse_template
from operators.k8s.times import parse

NS = 1_000_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class Script:
    """A log script, parsed: times in nanoseconds, lines as templates."""

    containers: frozenset[str]  # empty: every container
    start: tuple[tuple[int, Template], ...]  # (after, line), in time order
    interval: int  # 0: no periodic lines
    jitter: int
    every: tuple[Template, ...]
    exit: tuple[Template, ...]

    def covers(self, container: str) -> bool:
        return not self.containers or container in self.containers


def compile_script(lines: LogLines) -> Script:
    start = [(_ns(line.after), line.text) for line in lines.start]
    start.sort(key=lambda timed: timed[0])  # stable: lines of the same time keep their order
    every = lines.every
    return Script(
        containers=frozenset(lines.containers),
        start=tuple((after, parse_template(text)) for after, text in start),
        interval=_ns(every.interval) if every else 0,
        jitter=_ns(every.jitter) if every else 0,
        every=tuple(parse_template(text) for text in every.lines) if every else (),
        exit=tuple(parse_template(text) for text in lines.exit))


def _ns(duration: str) -> int:
    return round(parse_duration(duration) * NS)


def ns_of(stamp: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time (a status's startedAt)."""
    return round(parse(stamp) * NS)


# -- which run ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """One run of a container: its container ID, times (ns) and how it ended."""

    id: str
    started: int
    finished: int | None  # None: it runs
    restart: int  # 0 for the first run
    exit_code: int = 0
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A request the kubelet answers with an error: its status and text."""

    status: int
    text: str


def container_status(status: Mapping[str, Any], container: str) -> Mapping[str, Any] | None:
    for kind in ("containerStatuses", "initContainerStatuses"):
        for entry in status.get(kind) or ():
            if entry.get("name") == container:
                found: Mapping[str, Any] = entry
                return found
    return None


def run_of(status: Mapping[str, Any], pod: str, container: str,
           previous: bool) -> Run | Refusal:
    """The run whose log a request is for, as the kubelet chooses it from the pod's status
    (``previous``: the last terminated one), or the kubelet's refusal."""
    named = f'container "{container}" in pod "{pod}"'
    found = container_status(status, container)
    if found is None:
        return Refusal(400, f"{named} is not available")
    restarts = int(found.get("restartCount", 0))
    state = found.get("state") or {}
    last = (found.get("lastState") or {}).get("terminated")
    current = found.get("containerID", "")
    if previous:
        if not last or not last.get("containerID"):
            return Refusal(400, f'previous terminated container "{container}" in pod "{pod}" '
                                f'not found')
        return _ended(last, restarts - 1, named)
    if "running" in state and (state["running"] or {}).get("startedAt"):
        return Run(current, ns_of(state["running"]["startedAt"]), None, restarts)
    if "terminated" in state:
        ended = state["terminated"]
        if ended.get("containerID"):
            return _ended(ended, restarts, named)
        if last and last.get("containerID"):
            return _ended(last, restarts - 1, named)
        return Refusal(400, f"{named} is terminated")
    if last:
        if not last.get("containerID"):
            return Refusal(400, f"{named} is terminated")
        return _ended(last, restarts - 1, named)
    if "waiting" in state:
        reason = (state["waiting"] or {}).get("reason", "")
        why = {"ErrImagePull": "image can't be pulled",
               "ImagePullBackOff": "trying and failing to pull image"}.get(reason, reason)
        return Refusal(400, f"{named} is waiting to start: {why}")
    return Refusal(400, f"{named} is waiting to start - no logs yet")


def _ended(terminated: Mapping[str, Any], restart: int, named: str) -> Run | Refusal:
    if not terminated.get("startedAt") or not terminated.get("finishedAt"):
        return Refusal(400, f"{named} is terminated")
    return Run(terminated["containerID"], ns_of(terminated["startedAt"]),
               ns_of(terminated["finishedAt"]), max(restart, 0),
               int(terminated.get("exitCode", 0)), terminated.get("reason", ""))


def run_again(status: Mapping[str, Any], container: str, followed: Run) -> Run | None:
    """``followed`` as the pod's status shows it now: still running, ended (with its end), or
    None when the status shows it no more (the pod's next run took its place twice over, or
    the pod was evicted and its containers removed)."""
    found = container_status(status, container)
    if found is None:
        return None
    state = found.get("state") or {}
    if "running" in state and found.get("containerID") == followed.id:
        return followed
    for ended in ((state.get("terminated") or {}),
                  ((found.get("lastState") or {}).get("terminated") or {})):
        if ended.get("containerID") == followed.id and ended.get("finishedAt"):
            return dataclasses.replace(followed, finished=ns_of(ended["finishedAt"]),
                                       exit_code=int(ended.get("exitCode", 0)),
                                       reason=ended.get("reason", ""))
    return None


# -- the lines of a run ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Context:
    """What the placeholders of a pod's container are filled with."""

    pod: str
    namespace: str
    container: str
    node: str
    gpus: int
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    seed: str  # the pod's annotation fakefleet.dev/seed, else namespace/name


def _draw(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b("/".join(map(str, parts)).encode(),
                                          digest_size=8).digest(), "big")


class Timeline:
    """The lines of one run of one container, by position (0 is the first line)."""

    def __init__(self, script: Script, run: Run, context: Context) -> None:
        self.script = script
        self.run = run
        self.context = context
        self._seed = f"{context.seed}/{context.container}/{run.restart}"
        end = run.finished
        starts = [(run.started + after, line) for after, line in script.start
                  if end is None or run.started + after <= end]
        self._start_times = [at for at, _ in starts]
        self._start_lines = [line for _, line in starts]
        # Where each start line is: after every periodic line of an earlier time (a start
        # line comes first among lines of the same time).
        self._start_positions = [index + self._periodic(at - 1)
                                 for index, at in enumerate(self._start_times)]
        self._body = None if end is None else len(starts) + self._periodic(end)

    @property
    def ended(self) -> bool:
        return self.run.finished is not None

    def _periodic_time(self, k: int) -> int:
        jitter = _draw(self._seed, "every", k) % self.script.jitter if self.script.jitter else 0
        return self.run.started + k * self.script.interval + jitter

    def _periodic(self, until: int) -> int:
        """Periodic lines written by ``until``: lines 1..k (jitter is less than the interval,
        so it is k or k - 1 for k whole intervals)."""
        interval = self.script.interval
        if not interval or until < self.run.started + interval:
            return 0
        if self.run.finished is not None:
            until = min(until, self.run.finished)
        k = (until - self.run.started) // interval
        return k - 1 if self._periodic_time(k) > until else k

    def count(self, until: int) -> int:
        """How many lines are written by ``until`` (ns), that moment included."""
        end = self.run.finished
        cut = until if end is None else min(until, end)
        written = bisect.bisect_right(self._start_times, cut) + self._periodic(cut)
        if end is not None and until >= end:
            written += len(self.script.exit)
        return written

    def first_since(self, since: int) -> int:
        """The position of the first line written at ``since`` or later."""
        return self.count(since - 1)

    def time_at(self, position: int) -> int | None:
        """When the line at ``position`` is written (None: the run writes no such line)."""
        for time_, _ in self.lines(position, position + 1):
            return time_
        return None

    def lines(self, begin: int, end: int) -> Iterator[tuple[int, str]]:
        """The lines at positions ``begin`` to ``end`` (excluded), with their times; fewer if
        the run writes fewer."""
        index = bisect.bisect_left(self._start_positions, begin)
        starts = len(self._start_times)
        has_periodic = bool(self.script.interval)
        for position in range(begin, end):
            if index < starts and self._start_positions[index] == position:
                yield self._start_times[index], self._render(self._start_lines[index], 0,
                                                             f"start/{index}")
                index += 1
            elif self._body is None or position < self._body:
                if not has_periodic:
                    return
                k = position - index + 1
                template = self.script.every[(k - 1) % len(self.script.every)]
                yield self._periodic_time(k), self._render(template, k, f"every/{k}")
            else:
                line = position - self._body
                if line >= len(self.script.exit):
                    return
                assert self.run.finished is not None
                yield self.run.finished, self._render(self.script.exit[line], 0, f"exit/{line}")

    def _render(self, template: Template, n: int, line: str) -> str:
        """``template`` filled in; ``line`` tells the line apart for its random draws."""
        context, run = self.context, self.run
        parts = []
        for index, part in enumerate(template):
            if isinstance(part, str):
                parts.append(part)
                continue
            parts.append(self._fill(part, n, f"{line}/{index}", context, run))
        return "".join(parts)

    def _fill(self, part: Placeholder, n: int, where: str, context: Context, run: Run) -> str:
        name = part.name
        if name == "rand":
            return str(part.low + _draw(self._seed, where) % (part.high - part.low + 1))
        if name == "labels":
            return context.labels.get(part.key, "")
        if name == "annotations":
            return context.annotations.get(part.key, "")
        values = {"pod": context.pod, "namespace": context.namespace,
                  "container": context.container, "node": context.node,
                  "restart": run.restart, "gpus": context.gpus, "n": n,
                  "exitCode": run.exit_code, "reason": run.reason}
        return str(values[name])


# -- what a request asks ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """A log request's options (``v1.PodLogOptions`` as the kubelet decodes them)."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    tail: int | None = None
    since: int | None = None  # ns
    limit: int | None = None  # bytes


#: The kubelet's answers to options it cannot decode, and to options that are invalid.
UNDECODABLE = Refusal(400, '{"message": "Unable to decode query."}')
INVALID = Refusal(422, '{"message": "Invalid request."}')
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_options(query: Mapping[str, list[str]], now: int) -> Options | Refusal:
    """The options of a request's query, with the kubelet's answers to bad ones; ``now`` (ns)
    for ``sinceSeconds``."""
    values = {name: found[0] for name, found in query.items() if found}
    tail = values.pop("tail", None)
    if tail is not None and tail != "all":
        values["tailLines"] = tail  # the kubelet's older spelling
    elif tail == "all":
        values.pop("tailLines", None)
    try:
        flags = {name: _flag(values.get(name)) for name in ("follow", "previous", "timestamps")}
        numbers = {name: int(values[name]) if name in values else None
                   for name in ("tailLines", "limitBytes", "sinceSeconds")}
        since_time = ns_of(values["sinceTime"]) if "sinceTime" in values else None
    except ValueError:
        return UNDECODABLE
    tail_lines, limit, since_seconds = (numbers["tailLines"], numbers["limitBytes"],
                                        numbers["sinceSeconds"])
    stream = values.get("stream")
    if (tail_lines is not None and tail_lines < 0) or (limit is not None and limit < 1) or \
            (since_seconds is not None and (since_seconds < 1 or since_time is not None)) or \
            (stream is not None and (stream not in ("All", "Stdout", "Stderr")
                                     or (stream != "All" and tail_lines is not None))):
        return INVALID
    since = now - since_seconds * NS if since_seconds is not None else since_time
    return Options(tail=tail_lines, since=since, limit=limit, **flags)


def _flag(value: str | None) -> bool:
    if value is None or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise ValueError(value)


def window(timeline: Timeline, options: Options, now: int) -> tuple[int, int]:
    """The positions of the lines a request gets at once: those written by ``now`` (all of a
    run that ended), from ``since`` on, the last ``tail`` of them."""
    end = timeline.count(now)
    begin = 0 if options.since is None else min(timeline.first_since(options.since), end)
    if options.tail is not None:
        begin = max(begin, end - options.tail)
    return begin, end


def format_time(at: int) -> str:
    """RFC 3339 with nine fractional digits, always (the CRI's ``RFC3339NanoFixed``), in UTC."""
    seconds, nanos = divmod(at, NS)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(seconds))}.{nanos:09d}Z"


def render_line(at: int, text: str, timestamps: bool) -> bytes:
    line = f"{format_time(at)} {text}\n" if timestamps else f"{text}\n"
    return line.encode()


def take(timeline: Timeline, begin: int, end: int, *, timestamps: bool,
         size: int) -> tuple[bytes, int]:
    """Whole lines from position ``begin`` toward ``end``, about ``size`` bytes of them (at
    least one line): the bytes and the position after the last line taken (short of ``end``
    too when the run writes no more lines)."""
    out = bytearray()
    position = begin
    for at, text in timeline.lines(begin, end):
        out += render_line(at, text, timestamps)
        position += 1
        if len(out) >= size:
            break
    return bytes(out), position
