"""``kubectl exec`` and ``kubectl attach`` over a SPDY session, as the kubelet's remotecommand
server runs them (``k8s.io/cri-streaming`` ``pkg/streaming/remotecommand``), with a scripted
outcome where a container runtime would run a process.

The client opens the streams it asked for in the query (``input``, ``output``, ``error``,
``tty``): ``error`` first, then ``stdin``, ``stdout``, ``stderr``, and ``resize`` with a TTY
(v3 and v4 only). Once all have come, the command runs; what it printed goes out on stdout and
stderr, both are closed, and its status is written on the error stream, which is closed, and the
connection ends. The client waits for stdout and stderr to end before it reads the status.

The status, per protocol (the kubelet supports v4, v3, v2 and v1; v5 exists on WebSockets
only):

- v4: JSON, ``{"status":"Success"}``; for an exit code N, reason NonZeroExitCode with the
  cause ``{"reason":"ExitCode","message":"N"}``, which kubectl turns into "command terminated
  with exit code N" and its own exit code; any other failure, reason InternalError (code 500),
  which kubectl prints as it is.
- v2 and v3: a failure's message as plain text, nothing on success.
- v1: nothing: the v1 kubelet resets the error stream once the streams are there.

What the client sends on stdin and resize is read and dropped. With a TTY stderr does not
exist: the command's output goes to the terminal (stdout), with its line feeds as a terminal
shows them (CR LF).

No I/O of its own: the session writes, ``timers`` wait.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from operators.engine import spdy

logger = logging.getLogger(__name__)

V4, V3, V2, V1 = "v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"
#: The kubelet's protocols, as it prefers them.
PROTOCOLS = (V4, V3, V2, V1)
STDIN, STDOUT, STDERR, ERROR, RESIZE = "stdin", "stdout", "stderr", "error", "resize"
#: How long the kubelet waits for the client to open every stream it asked for (seconds).
STREAM_CREATION_TIMEOUT = 30.0
#: How often an attach looks whether its container still runs (seconds).
ATTACH_POLL = 1.0


class Timer(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """What waits: an event loop's ``call_later``, or a test's fake."""

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer: ...


@dataclasses.dataclass(frozen=True)
class Options:
    """Which streams a request asks for."""

    stdin: bool
    stdout: bool
    stderr: bool
    tty: bool

    @classmethod
    def of(cls, query: Mapping[str, Sequence[str]]) -> Options:
        """The options of a request's query; ValueError with the kubelet's words when it asks
        for no stream."""
        def flag(name: str) -> bool:
            return (query.get(name) or [""])[0] == "1"
        tty = flag("tty")
        # As the kubelet: a TTY has no separate stderr, so stderr is dropped quietly.
        options = cls(flag("input"), flag("output"), flag("error") and not tty, tty)
        if not (options.stdin or options.stdout or options.stderr):
            raise ValueError("you must specify at least 1 of stdin, stdout, stderr")
        return options

    def expected(self, protocol: str) -> int:
        """How many streams the client opens: error, and each one asked for."""
        resize = self.tty and protocol in (V4, V3)
        return 1 + self.stdin + self.stdout + self.stderr + resize


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a command did: its output and exit code, or why it could not run (``error``, the
    runtime's words)."""

    stdout: bytes = b""
    stderr: bytes = b""
    code: int = 0
    error: str = ""
    delay: float = 0.0  # how long it ran, in seconds
    command: tuple[str, ...] = ()


def go_json(value: Any) -> bytes:
    """JSON as Go's ``encoding/json`` writes it: compact, UTF-8, ``<``, ``>`` and ``&``
    escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for plain, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                           ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(plain, escaped)
    return text.encode()


def status(outcome: Outcome) -> dict[str, Any]:
    """The v4 status of ``outcome``, its fields in the kubelet's order."""
    if outcome.error:
        return {"status": "Failure",
                "message": f"Internal error occurred: error executing command in container: "
                           f"{outcome.error}",
                "reason": "InternalError", "code": 500}
    if outcome.code:
        # containerd's words for the exit (approximate): the client reads only the code.
        words = f"[{' '.join(outcome.command)}]"
        return {"status": "Failure",
                "message": f"command terminated with non-zero exit code: error executing "
                           f"command {words}, exit code {outcome.code}",
                "reason": "NonZeroExitCode",
                "details": {"causes": [{"reason": "ExitCode", "message": str(outcome.code)}]}}
    return {"status": "Success"}


def status_bytes(outcome: Outcome, protocol: str) -> bytes:
    """What the error stream carries for ``outcome`` under ``protocol``."""
    written = status(outcome)
    if protocol == V4:
        return go_json(written)
    return str(written.get("message", "")).encode()


class RemoteCommand:
    """One exec or attach on one session (a :class:`~operators.engine.spdy.Streams`): the
    streams gathered, then ``run(self)`` starts the work, which ends in :meth:`finish`."""

    def __init__(self, session: spdy.Session, *, protocol: str, options: Options,
                 timers: Timers, run: Callable[[RemoteCommand], None]) -> None:
        self.session = session
        self.protocol = protocol
        self.options = options
        self.streams: dict[str, spdy.Stream] = {}
        self._timers = timers
        self._run = run
        self._known = (ERROR, STDIN, STDOUT, STDERR) + ((RESIZE,) if protocol in (V4, V3)
                                                        else ())
        self._waiting = options.expected(protocol)
        self._pending: set[Timer] = set()
        self.later(STREAM_CREATION_TIMEOUT, self._expired)

    def later(self, delay: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` after ``delay`` seconds, unless the connection goes first."""
        timer: Timer | None = None

        def fire() -> None:
            if timer is not None:
                self._pending.discard(timer)
            callback()
        timer = self._timers.call_later(delay, fire)
        self._pending.add(timer)

    def _expired(self) -> None:
        if self._waiting:
            logger.info("remotecommand: timed out waiting for client to create streams")
            self.session.finish()

    # -- spdy.Streams ---------------------------------------------------------------------------

    def admit(self, stream: spdy.Stream) -> str:
        return ""  # as the kubelet: every stream is replied to, one it does not know ignored

    def opened(self, stream: spdy.Stream) -> None:
        kind = stream.header("streamtype")
        if kind not in self._known or not self._waiting:
            logger.info("remotecommand: unexpected stream type %r", kind)
            return
        self.streams[kind] = stream
        self._waiting -= 1
        if self._waiting:
            return
        for timer in self._pending:
            timer.cancel()
        self._pending.clear()
        if self.protocol == V1:  # as the v1 kubelet: its status never reaches the client
            self.streams[ERROR].reset()
            if STDIN in self.streams:
                self.streams[STDIN].close()
        self._run(self)

    def received(self, stream: spdy.Stream, data: bytes) -> None:
        """Stdin and resize events: read and dropped (no scripted command reads them)."""

    def ended(self, stream: spdy.Stream) -> None:
        """The client closed stdin: nothing waits for it."""

    def reset(self, stream: spdy.Stream) -> None:
        """A stream the client reset: what is written to it later goes nowhere."""

    def lost(self) -> None:
        for timer in self._pending:
            timer.cancel()
        self._pending.clear()

    # -- the end --------------------------------------------------------------------------------

    def finish(self, outcome: Outcome) -> None:
        """Write what the command printed, close stdout and stderr, write its status on the
        error stream, close it, and end the connection."""
        stdout, stderr = self.streams.get(STDOUT), self.streams.get(STDERR)
        if self.options.tty:
            terminal = (outcome.stdout + outcome.stderr).replace(b"\r\n", b"\n")
            if stdout is not None:
                stdout.write(terminal.replace(b"\n", b"\r\n"))
        else:
            if stdout is not None:
                stdout.write(outcome.stdout)
            if stderr is not None:
                stderr.write(outcome.stderr)
        for stream in (stdout, stderr):
            if stream is not None:
                stream.close()
        error = self.streams.get(ERROR)
        if error is not None:
            written = status_bytes(outcome, self.protocol)
            if written:
                error.write(written)
            error.close()
        self.session.finish()


def execute(outcome: Outcome) -> Callable[[RemoteCommand], None]:
    """The run of an exec: ``outcome`` after its delay."""
    def run(command: RemoteCommand) -> None:
        if outcome.delay > 0:
            command.later(outcome.delay, lambda: command.finish(outcome))
        else:
            command.finish(outcome)
    return run


def attach(running: Callable[[], bool]) -> Callable[[RemoteCommand], None]:
    """The run of an attach: nothing is printed (the engine keeps no process output), and it
    ends with Success once the container no longer runs, as an attach ends when the container's
    process exits. ``running`` is asked every :data:`ATTACH_POLL` seconds."""
    def run(command: RemoteCommand) -> None:
        def look() -> None:
            if running():
                command.later(ATTACH_POLL, look)
            else:
                command.finish(Outcome())
        look()
    return run
