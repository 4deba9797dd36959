"""CEL expectations judged in worker processes, never on the operator's event loop.

A user's expression may ask for 10^8 steps or gigabytes (cel-python has no cost budget), and
neither a thread nor the event loop can be stopped or capped, so :class:`CelWorkers` sends every
judgement to a worker process (:mod:`operators.faults.cel`) and only waits for its answers:
every plan, and everything else the operator does, keeps its pace meanwhile.

- **Budget.** Each object's evaluation may take :attr:`Limits.budget` of CPU time (100 ms by
  default; CPU time, so a busy machine does not fail a sane expression), and a worker
  :attr:`Limits.memory` of address space (256 MiB). A worker that says nothing for
  :attr:`Limits.stall` seconds while it works (stuck where its timer cannot interrupt it) is
  killed. An expression over a limit is :class:`CelRefused`: its expectation fails, saying
  which limit and on which object; a judged expression that passed is never judged again, so
  a hostile one costs one budget, also after a restart.
- **Bounded.** At most :attr:`Limits.workers` processes, each started when first needed and
  kept for the next judgement: one pool, not a process per evaluation.
- **Supervised.** A worker that died (killed, out of memory) is replaced by the next
  judgement; one that dies in a judgement gets it again once on a new worker, so a death that
  was no fault of the expression fails nothing. A worker that cannot start is started again
  after a back-off, and meanwhile :class:`CelUnavailable` leaves expectations pending.
- **Closed.** :meth:`CelWorkers.close` ends every worker (its stdin closed, then SIGKILL if it
  does not exit), on every path of the operator's shutdown.

This module knows no cel-python (only :mod:`operators.faults.cel` does) and no plan: the runner
(:mod:`operators.faults.running`) asks it about the objects it picked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from operators.faults.expectations import ExpectationError

logger = logging.getLogger(__name__)

#: How long a worker may take to start and say it is ready (s): an interpreter and cel-python.
STARTUP = 30.0
#: How long a worker gets to exit once its stdin is closed (s), before SIGKILL.
EXIT_GRACE = 2.0
#: Back-off between attempts to start a worker that failed to start (s).
FIRST_RETRY = 1.0
LONGEST_RETRY = 60.0
#: Longest line a worker sends (its answers are short; a refusal quotes the expression).
LINE_LIMIT = 1 << 20
#: How much of an expression a message quotes.
QUOTED = 80


class CelRefused(ExpectationError):
    """The expression cannot be judged: it does not parse, or it went over a limit. Its
    expectation fails with this message."""


class CelUnavailable(Exception):
    """No worker could be started now (the next look tries again)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one judgement may cost, and how many workers share the work."""

    #: CPU seconds one object's evaluation may take.
    budget: float = 0.1
    #: Bytes of address space one worker may use (RLIMIT_AS).
    memory: int = 256 << 20
    #: Seconds a working worker may say nothing before it is killed.
    stall: float = 30.0
    workers: int = 2

    def __post_init__(self) -> None:
        if not (0 < self.budget <= 60 and 0 < self.stall <= 600 and self.workers >= 1
                and self.memory >= 64 << 20):
            raise ValueError(f"CEL limits out of range: {self}: give a budget of (0, 60] s, "
                             f"a stall of (0, 600] s, at least 1 worker and 64 MiB")


def quoted(expression: str) -> str:
    short = expression if len(expression) <= QUOTED else expression[:QUOTED] + "..."
    return repr(short)


def named(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{obj.get('kind') or 'object'} {where}{meta.get('name', '?')}"


class _Died(Exception):
    """The worker ended in the middle of a judgement."""


class Worker:
    """One worker process and its pipes; used by one judgement at a time."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.judged = 0

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    @classmethod
    async def start(cls, argv: Sequence[str]) -> Worker:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT)
        worker = cls(process)
        try:
            line = await asyncio.wait_for(worker._stdout.readline(), STARTUP)
            if json.loads(line or b"{}").get("ready") is not True:
                raise CelUnavailable(f"the CEL worker exited at its start (status "
                                     f"{await process.wait()})")
        except BaseException:
            await worker.close()
            raise
        return worker

    @property
    def _stdout(self) -> asyncio.StreamReader:
        assert self.process.stdout is not None
        return self.process.stdout

    async def judge(self, expression: str, objects: Sequence[Mapping[str, Any]],
                    limits: Limits) -> list[bool]:
        """Whether each object matches; CelRefused over a limit; _Died if it died. A worker
        that refused stays in step (it read every object); one that stalled is killed."""
        self.judged += 1
        writing = asyncio.create_task(self._send(expression, objects))
        matched: list[bool] = []
        in_step = False
        try:
            while True:
                try:
                    line = await asyncio.wait_for(self._stdout.readline(), limits.stall)
                except TimeoutError:
                    await self.kill()
                    raise CelRefused(
                        f"cel: {quoted(expression)} went over its budget: the evaluation "
                        f"made no progress for {limits.stall:g}s (on "
                        f"{named(objects[min(len(matched), len(objects) - 1)])}); simplify "
                        f"it") from None
                if not line:
                    raise _Died(f"exit status {await self.process.wait()}")
                answer = json.loads(line)
                matched += answer.get("matched") or []
                if "refused" in answer:
                    in_step = True
                    raise CelRefused(str(answer["refused"]))
                if "over" in answer:
                    if answer["over"] == "memory":
                        await self.process.wait()  # it exits: a new one has a clean heap
                    else:
                        in_step = True
                    raise CelRefused(_over(expression, answer, objects, limits))
                if answer.get("done"):
                    in_step = True
                    return matched
        finally:
            if in_step:
                with contextlib.suppress(ConnectionError):
                    await writing  # the worker reads every object it was sent
            else:
                writing.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await writing

    async def _send(self, expression: str, objects: Sequence[Mapping[str, Any]]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(_line({"expression": expression, "objects": len(objects)}))
        for obj in objects:
            # One object at a time, so that a long list never holds the loop for long.
            stdin.write(_line(obj))
            await stdin.drain()

    async def close(self) -> None:
        """End the worker: its stdin closed, then SIGKILL if it does not exit."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        if self.alive:
            try:
                await asyncio.wait_for(self.process.wait(), EXIT_GRACE)
            except TimeoutError:
                await self.kill()
        await self.process.wait()

    async def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()


class CelWorkers:
    """The operator's pool of CEL workers (one per operator, shared by every plan)."""

    def __init__(self, limits: Limits = Limits(), *,
                 argv: Sequence[str] | None = None) -> None:
        self.limits = limits
        self.argv = list(argv) if argv is not None else [
            sys.executable, "-m", "operators.faults.cel", "--budget", str(limits.budget),
            "--memory", str(limits.memory)]
        self._idle: list[Worker] = []
        self._working: set[Worker] = set()
        self._slots = asyncio.Semaphore(limits.workers)
        self._failures = 0
        self._retry_at = 0.0
        self._problem = ""
        #: Workers started, replacements included (for tests and the log).
        self.started = 0
        self._closed = False

    async def matches(self, expression: str,
                      objects: Sequence[Mapping[str, Any]]) -> list[bool]:
        """Whether ``expression`` holds for each of ``objects``, in order. CelRefused: it
        cannot be judged (its expectation fails); CelUnavailable: not now."""
        if not objects:
            return []
        for attempt in (1, 2):
            async with self._slots:
                worker = await self._take()
                done = False
                try:
                    matched = await worker.judge(expression, objects, self.limits)
                    done = True
                    return matched
                except CelRefused:
                    done = worker.alive  # a refusal keeps the worker in step, unless it died
                    raise
                except _Died as death:
                    logger.warning("the CEL worker (pid %s) died judging %s: %s%s",
                                   worker.process.pid, quoted(expression), death,
                                   "; judging it again on a new worker" if attempt == 1 else "")
                    if attempt == 2:
                        raise CelRefused(
                            f"cel: {quoted(expression)} went over its budget: it killed the "
                            f"worker that evaluated it twice ({death}), probably beyond the "
                            f"memory limit of {self.limits.memory >> 20} MiB; simplify "
                            f"it") from None
                finally:
                    self._working.discard(worker)
                    if done and worker.alive and not self._closed:
                        self._idle.append(worker)
                    else:
                        await worker.kill()
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _take(self) -> Worker:
        """An idle worker, or a new one (replacing one that died meanwhile)."""
        if self._closed:
            raise CelUnavailable("the operator is stopping")
        while self._idle:
            worker = self._idle.pop()
            if worker.alive:
                self._working.add(worker)
                return worker
            logger.warning("the CEL worker (pid %s) exited (status %s) while idle; starting "
                           "another", worker.process.pid, worker.process.returncode)
        now = time.monotonic()
        if now < self._retry_at:
            raise CelUnavailable(f"the CEL worker cannot start ({self._problem}); trying "
                                 f"again in {self._retry_at - now:.0f}s")
        try:
            worker = await Worker.start(self.argv)
        except (OSError, ValueError, TimeoutError, CelUnavailable) as error:
            self._failures += 1
            delay = min(LONGEST_RETRY, FIRST_RETRY * 2 ** (self._failures - 1))
            self._retry_at = time.monotonic() + delay
            self._problem = str(error) or type(error).__name__
            logger.error("the CEL worker cannot start (attempt %d, next in %.0fs)",
                         self._failures, delay, exc_info=error)
            raise CelUnavailable(f"the CEL worker cannot start: {self._problem}") from error
        self._failures = 0
        self.started += 1
        self._working.add(worker)
        return worker

    async def close(self) -> None:
        """End every worker; judgements still running end with CelUnavailable."""
        self._closed = True
        workers = [*self._idle, *self._working]
        self._idle.clear()
        await asyncio.gather(*(worker.close() for worker in workers),
                             return_exceptions=True)


def _over(expression: str, answer: Mapping[str, Any], objects: Sequence[Mapping[str, Any]],
          limits: Limits) -> str:
    what = answer.get("over")
    index = int(answer.get("index") or 0)
    on = named(objects[index]) if 0 <= index < len(objects) else "an object"
    if what == "compile":
        return f"cel: {quoted(expression)} went over its budget: it takes too long to compile"
    if what == "memory":
        return (f"cel: {quoted(expression)} went over its budget: it needs more than the "
                f"memory limit of {limits.memory >> 20} MiB (on {on}); simplify it")
    return (f"cel: {quoted(expression)} went over its budget of {limits.budget * 1000:g} ms "
            f"of CPU time per object (on {on}); simplify it")


def _line(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
