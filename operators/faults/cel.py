"""CEL expressions over observed objects, for expectations (``cel: self.status.succeeded >= 8``),
and the worker process that evaluates them (``python -m operators.faults.cel``).

:class:`CelMatcher` compiles an expression once and says whether it holds for an object: one
that does not parse is an :class:`~operators.faults.expectations.ExpectationError` with the
parser's message; one that cannot be evaluated on an object (a field it reads is not there yet)
does not hold for that object.

cel-python has no cost budget, and an expression of 1024 characters can ask for 10^8 steps or
gigabytes, so the operator never evaluates one itself: :mod:`operators.faults.evaluating` sends
each judgement here, to a worker process that :func:`serve` runs. The worker caps its own
address space (``RLIMIT_AS``) and the CPU time of each object's evaluation (a profiling timer
whose signal interrupts cel-python between two steps), and says which limit an expression
passed; a limit it cannot enforce itself (a step stuck in C code) is the operator's to enforce,
by killing it.

The wire, one JSON document per line. The worker says ``{"ready": true}`` once it can work.
Then, for each judgement, the operator sends ``{"expression": ..., "objects": N}`` and the N
objects, one per line; the worker answers with ``{"matched": [...]}`` lines (one bool per
object, in order, at least every :data:`FLUSH` seconds while it works) and ends with
``"done": true``, or with ``"refused"`` (the expression cannot be used), ``"over": "cpu"`` or
``"over": "memory"`` (with ``"index"``, the object it was evaluating). It reads every object it
was sent, also those it no longer evaluates, so the next judgement starts in step. After
``"over": "memory"`` it exits: a new worker starts with a clean heap.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import IO, Any

import celpy
from celpy.adapter import json_to_cel
from celpy.celparser import CELParseError
from celpy.celtypes import BoolType
from celpy.evaluation import CELEvalError, CELSyntaxError

from operators.faults.expectations import ExpectationError

_ENVIRONMENT = celpy.Environment()
#: How often, at least, a working worker says how far it got (s): the operator's sign of life.
FLUSH = 0.05
#: CPU time an expression may take to compile (s): parsing is linear, this is generous.
COMPILE_BUDGET = 1.0
#: Compiled expressions a worker keeps (an expression is judged again on every look).
PROGRAMS = 256
#: CPU seconds between two reminders of a budget already spent (see :func:`cpu_budget`).
AGAIN = 0.01
#: The worker's exit status after an expression ran out of memory.
EXIT_MEMORY = 3


class CelMatcher:
    """Holds for an object when the expression, with the object as ``self``, is true."""

    def __init__(self, expression: str) -> None:
        self.expression = expression
        try:
            self._program = _ENVIRONMENT.program(_ENVIRONMENT.compile(expression))
        except (CELParseError, RecursionError) as error:
            raise ExpectationError(f"cel: {expression!r} is not a CEL expression: "
                                   f"{' '.join(str(error).split())}") from error
        except Exception as error:  # the library's other refusals (macros misused, ...)
            raise ExpectationError(f"cel: {expression!r} cannot be used: "
                                   f"{' '.join(str(error).split())}") from error

    def matches(self, obj: Mapping[str, Any]) -> bool:
        try:
            result = self._program.evaluate({"self": json_to_cel(dict(obj))})
        except CELSyntaxError as error:  # found only once evaluated (a macro misused)
            raise ExpectationError(f"cel: {self.expression!r} is not a CEL expression: "
                                   f"{' '.join(str(error).split())[:200]}") from error
        except CELEvalError as error:
            if _out_of_memory(error):  # cel-python wraps every Python error, this one too
                raise MemoryError(str(error)) from error
            return False  # a field it reads is missing or of another type: not this object
        except (RecursionError, TypeError, ValueError):
            return False
        return isinstance(result, BoolType) and bool(result)


def _out_of_memory(error: BaseException) -> bool:
    causes = [error.__cause__, error.__context__, *error.args]
    return any(isinstance(cause, MemoryError)
               or (isinstance(cause, type) and issubclass(cause, MemoryError))
               for cause in causes)


# -- the worker --------------------------------------------------------------------------------

class OverBudget(BaseException):
    """The CPU timer ran out. A BaseException: cel-python turns every Exception raised while it
    evaluates into an evaluation error ("does not hold"), and this must get through."""


def _on_timer(signum: int, frame: FrameType | None) -> None:
    raise OverBudget


@contextlib.contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """Raise :class:`OverBudget` in the block once it used ``seconds`` of CPU time, and again
    every :data:`AGAIN` seconds after: a signal that lands in a finaliser is ignored there
    ("Exception ignored in ..."), and the block must not run on for want of another."""
    signal.setitimer(signal.ITIMER_PROF, seconds, AGAIN)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


Say = Callable[[dict[str, Any]], None]


def serve(stdin: IO[bytes], stdout: IO[bytes], *, budget: float, memory: int | None) -> int:
    """Answer judgements until ``stdin`` ends (the operator went); the exit status."""
    if memory:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    signal.signal(signal.SIGPROF, _on_timer)

    def say(message: dict[str, Any]) -> None:
        stdout.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        stdout.flush()

    say({"ready": True})
    programs: dict[str, CelMatcher] = {}
    while header := stdin.readline():
        request = json.loads(header)
        count = int(request["objects"])
        try:
            judge(str(request["expression"]), count, stdin, say, budget=budget,
                  programs=programs)
        except MemoryError:
            return EXIT_MEMORY
    return 0


def judge(expression: str, count: int, stdin: IO[bytes], say: Say, *, budget: float,
          programs: dict[str, CelMatcher]) -> None:
    """One judgement: ``count`` objects read from ``stdin``, answered through ``say``.
    MemoryError (after saying so) when an object's evaluation ran out of memory."""
    read = 0

    def skip() -> None:
        for _ in range(count - read):
            stdin.readline()

    try:
        matcher = programs.get(expression)
        if matcher is None:
            with cpu_budget(COMPILE_BUDGET):
                matcher = CelMatcher(expression)
            if len(programs) >= PROGRAMS:
                programs.clear()
            programs[expression] = matcher
    except ExpectationError as error:
        say({"refused": str(error)})
        skip()
        return
    except OverBudget:
        say({"over": "compile"})
        skip()
        return
    matched: list[bool] = []
    said = time.monotonic()
    while read < count:
        line = stdin.readline()
        read += 1
        try:
            with cpu_budget(budget):
                matched.append(matcher.matches(json.loads(line)))
        except OverBudget:
            say({"matched": matched, "over": "cpu", "index": read - 1})
            skip()
            return
        except ExpectationError as error:
            say({"matched": matched, "refused": str(error)})
            skip()
            return
        except MemoryError:
            matched = []  # what it holds goes first: saying so needs a little memory
            say({"over": "memory", "index": read - 1})
            raise
        if time.monotonic() - said >= FLUSH:
            say({"matched": matched})
            matched, said = [], time.monotonic()
    say({"matched": matched, "done": True})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m operators.faults.cel",
                                     description="evaluate CEL expectations for the operator")
    parser.add_argument("--budget", type=float, required=True,
                        help="CPU seconds one object's evaluation may take")
    parser.add_argument("--memory", type=int, default=0,
                        help="bytes of address space the worker may use (0: no limit)")
    args = parser.parse_args(argv)
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        return serve(sys.stdin.buffer, sys.stdout.buffer, budget=args.budget,
                     memory=args.memory or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
