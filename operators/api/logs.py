"""What ``kubectl logs`` shows of a fake container: log scripts, as data.

A script has lines at the run's start, lines every interval while it runs, and lines when it
exits; the engine computes a run's log from the script and the run's times whenever it is asked
(:mod:`operators.engine.logs`), and stores nothing::

    containers: [vllm]                  # default: every container of the pod (init ones too)
    start:                              # at the run's start (startedAt), plus `after`
    - "INFO Starting vLLM API server on http://0.0.0.0:8000"
    - {after: 3s, text: "INFO Loaded model {annotations[model]} on {gpus} GPU(s)"}
    every:                              # line n at start + n * interval (+ a seeded jitter)
      interval: 10s
      lines: ["INFO throughput: {rand:200..900} tokens/s, running: {rand:0..16} reqs"]
    exit:                               # when a run ends (finishedAt)
    - "ERROR worker exited with code {exitCode} ({reason})"

Such a script is the pod annotation ``fakefleet.dev/logs`` (JSON or YAML), or, with a name and
a selector, an entry of the ``logs`` section of a ``kind: Lifecycle`` document
(:class:`operators.api.stages.LogScript`). Every error names the field, the value and what
would be accepted.

Placeholders (:data:`PLACEHOLDERS`) are parsed here, once, so that a script that loads renders;
``{{`` and ``}}`` are literal braces.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Annotated

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from operators.api.base import Model
from operators.api.durations import DURATION_LENGTH, DURATION_PATTERN, parse_duration

Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=DURATION_LENGTH)]

#: The longest line a script may have (characters, before placeholders are filled).
MAX_LINE = 4096
#: The most lines one section may have.
MAX_LINES = 100
#: The shortest interval of periodic lines: a follower gets at most ten lines a second.
MIN_INTERVAL = 0.1
#: The problems of a script that an error names (the rest are counted).
SHOWN = 5
#: The widest bounds of ``{rand:A..B}``.
RAND_BOUND = 10 ** 12

#: What a placeholder may name, and what it is filled with.
PLACEHOLDERS: dict[str, str] = {
    "pod": "the pod's name",
    "namespace": "the pod's namespace",
    "container": "the container's name",
    "node": "the node's name",
    "restart": "the run's number: 0 for the first, the restart count after",
    "gpus": "the GPUs (nvidia.com/gpu) the container requests",
    "labels[KEY]": "the pod's label KEY (empty if unset)",
    "annotations[KEY]": "the pod's annotation KEY (empty if unset)",
    "rand:A..B": "a whole number from A to B, the same for the same pod, run and line",
    "n": "in `every` lines: the line's number, 1 for the first",
    "exitCode": "in `exit` lines: the run's exit code",
    "reason": "in `exit` lines: why the run ended (Completed, Error, OOMKilled, ...)",
}
#: Placeholders only one section may use (the others have no such value).
ONLY_IN = {"n": "every", "exitCode": "exit", "reason": "exit"}
_SIMPLE = frozenset({"pod", "namespace", "container", "node", "restart", "gpus", "n",
                     "exitCode", "reason"})
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_MAP = re.compile(r"(labels|annotations)\[([^\[\]]+)\]")
_RAND = re.compile(r"rand:(-?[0-9]{1,13})\.\.(-?[0-9]{1,13})")


@dataclasses.dataclass(frozen=True, slots=True)
class Placeholder:
    """One ``{...}`` of a line: its name, the key of ``labels[KEY]``/``annotations[KEY]``, the
    bounds of ``rand:A..B``."""

    name: str
    key: str = ""
    low: int = 0
    high: int = 0


#: A line as parsed: literal text and placeholders, in order.
Template = tuple[str | Placeholder, ...]


def parse_template(text: str) -> Template:
    """The parts of ``text``; ValueError naming what is wrong and what is accepted."""
    parts: list[str | Placeholder] = []
    literal: list[str] = []
    at = 0
    for found in _TOKEN.finditer(text):
        literal.append(text[at:found.start()])
        at = found.end()
        token = found.group(0)
        if token in ("{{", "}}"):
            literal.append(token[0])
            continue
        if found.group(1) is None:
            raise ValueError(f"a lone {token!r} at character {found.start()}: write {token * 2} "
                             f"for a literal brace, or a placeholder such as {{pod}}")
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(_placeholder(found.group(1)))
    literal.append(text[at:])
    if "".join(literal):
        parts.append("".join(literal))
    return tuple(parts)


def _placeholder(inner: str) -> Placeholder:
    if inner in _SIMPLE:
        return Placeholder(inner)
    mapped = _MAP.fullmatch(inner)
    if mapped:
        return Placeholder(mapped.group(1), key=mapped.group(2))
    rand = _RAND.fullmatch(inner)
    if rand:
        low, high = int(rand.group(1)), int(rand.group(2))
        if not -RAND_BOUND <= low <= high <= RAND_BOUND:
            raise ValueError(f"{{{inner}}}: A..B needs A <= B, both within "
                             f"{-RAND_BOUND}..{RAND_BOUND}, e.g. {{rand:200..900}}")
        return Placeholder("rand", low=low, high=high)
    raise ValueError(f"unknown placeholder {{{inner[:60]}}}; known: "
                     f"{', '.join('{' + name + '}' for name in PLACEHOLDERS)}")


def _line(text: str, section: str) -> str:
    if "\n" in text or "\r" in text:
        raise ValueError("a line has no line break: put each line in the list on its own")
    for part in parse_template(text):
        if isinstance(part, Placeholder) and ONLY_IN.get(part.name, section) != section:
            raise ValueError(f"{{{part.name}}} has a value in `{ONLY_IN[part.name]}` lines "
                             f"only, not in `{section}` lines")
    return text


Line = Annotated[str, Field(max_length=MAX_LINE)]
StartLine = Annotated[Line, AfterValidator(lambda text: _line(text, "start"))]
EveryLine = Annotated[Line, AfterValidator(lambda text: _line(text, "every"))]
ExitLine = Annotated[Line, AfterValidator(lambda text: _line(text, "exit"))]


class TimedLine(Model):
    """A start line some time after the run started."""

    text: StartLine
    """The line, placeholders and all."""
    after: Duration = "0s"
    """How long after the run's start it is written, e.g. 3s."""


class Every(Model):
    """Lines written while the run lasts: line n at start + n * interval, plus up to
    ``jitter`` drawn per line (the same for the same pod and run); the lines in turn."""

    interval: Duration
    """At least 100ms, e.g. 10s."""
    jitter: Duration = "0s"
    """Less than the interval, so the lines keep their order."""
    lines: list[EveryLine] = Field(min_length=1, max_length=MAX_LINES)
    """Line n is lines[(n - 1) % len(lines)]."""

    @model_validator(mode="after")
    def _ordered(self) -> Every:
        interval, jitter = parse_duration(self.interval), parse_duration(self.jitter)
        if interval < MIN_INTERVAL:
            raise ValueError(f"interval {self.interval} is shorter than 100ms: give 100ms or "
                             f"more, e.g. 10s")
        if jitter >= interval:
            raise ValueError(f"jitter {self.jitter} is not less than the interval "
                             f"{self.interval}: lines would change places; give less")
        return self


class LogLines(Model):
    """A log script: what a container's runs write (the annotation ``fakefleet.dev/logs``)."""

    containers: list[str] = Field(default_factory=list, max_length=MAX_LINES)
    """The containers it is for (init containers too); empty: every container of the pod."""
    start: list[TimedLine] = Field(default_factory=list, max_length=MAX_LINES)
    """Lines at the run's start (a plain string: at once); a line with `after` that much
    later."""
    every: Every | None = None
    """Lines written periodically while the run lasts."""
    exit: list[ExitLine] = Field(default_factory=list, max_length=MAX_LINES)
    """Lines written when the run ends (with its finishedAt)."""

    @field_validator("start", mode="before")
    @classmethod
    def _plain_lines(cls, lines: object) -> object:
        """A plain string is a line written at the start itself."""
        if not isinstance(lines, list):
            return lines
        return [{"text": line} if isinstance(line, str) else line for line in lines]

    @model_validator(mode="after")
    def _writes_something(self) -> LogLines:
        if not (self.start or self.every or self.exit):
            raise ValueError("the script writes nothing: give start, every or exit lines")
        return self


def load_log_lines(text: str, *, source: str) -> LogLines:
    """A script from JSON or YAML (an annotation's value); ValueError naming each problem."""
    try:
        document = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as error:
        raise ValueError(f"{source} is neither JSON nor YAML: {error}") from error
    try:
        return LogLines.model_validate(document)
    except ValidationError as error:
        found = problems(error)
        more = f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise ValueError(f"{source} is not a log script: {'; '.join(found[:SHOWN])}{more}") \
            from error


def problems(error: ValidationError) -> list[str]:
    """Each problem of ``error`` as ``field.path: message (got value)``."""
    found = []
    for problem in error.errors(include_url=False):
        place = ".".join(str(part) for part in problem["loc"]
                         if not str(part).startswith("function-"))
        value = problem.get("input")
        shown = f" (got {str(value)[:60]!r})" if isinstance(value, str | int | float) else ""
        message = problem["msg"].removeprefix("Value error, ")
        found.append(f"{place or 'the script'}: {message}{shown}")
    return found
