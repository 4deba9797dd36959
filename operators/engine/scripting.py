"""What a fake container does when a user execs into it or forwards a port to it: the
Lifecycle's ``exec`` and ``portForward`` sections (``stages.yaml``'s defaults, or ``--stages``),
with the pod's own annotations ``fakefleet.dev/exec`` and ``fakefleet.dev/port-forward`` before
them. Pure: a pod as the engine sees it in, an outcome or an answer out.

A command is matched word for word (``sh -c "<words>"`` and ``bash -c`` too, as the words the
shell would run); one no script matches fails as a container runtime fails it: "executable file
not found in $PATH" for a command, "not found" with exit code 127 from a shell. ``nvidia-smi -L``
on a container that holds GPUs lists them with the model names and UUIDs the cluster publishes:
DCGM's ``modelName`` (:data:`~operators.metrics.dcgm.PRODUCTS`) and
:func:`~operators.api.gpus.gpu_uuid`, the UUID of the DRA devices and the DCGM series too.

A pod here is a :class:`PodSight`: what the kubelet's streaming endpoints need to know of it.
:func:`sight` makes one from the engine's :class:`~operators.engine.pods.PodFacts` and
:class:`~operators.engine.pods.PodLife`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Generic, TypeVar

from operators.api.durations import parse_duration
from operators.api.gpus import gpu_uuid
from operators.api.stages import (
    PLACEHOLDER,
    ExecScript,
    Lifecycle,
    PortForwardRule,
    Requirement,
    Selector,
    StageError,
    load_scripts,
)
from operators.engine import pods as podlife
from operators.engine.pods import PodFacts, PodLife
from operators.engine.portforward import Reply
from operators.engine.remotecommand import Outcome
from operators.metrics.dcgm import PRODUCTS
from primitives import keys, selectors

logger = logging.getLogger(__name__)

#: Shells whose ``-c`` command is matched as the words it runs.
SHELLS = frozenset({"sh", "bash", "ash", "dash"})


@dataclasses.dataclass(frozen=True, slots=True)
class GPU:
    """A GPU a container holds: its index on the node, its model name, its UUID."""

    index: int
    model: str
    uuid: str


@dataclasses.dataclass(frozen=True, slots=True)
class ContainerSight:
    name: str
    running: bool
    gpus: tuple[GPU, ...] = ()


@dataclasses.dataclass(frozen=True)
class PodSight:
    """A pod as the kubelet's streaming endpoints see it."""

    uid: str
    namespace: str
    name: str
    node: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    #: Whether the pod's sandbox runs (port-forward reaches it): from the start of its init
    #: containers until it ends, crash-looping included.
    sandbox: bool
    containers: tuple[ContainerSight, ...]

    def container(self, name: str) -> ContainerSight | None:
        return next((c for c in self.containers if c.name == name), None)

    @property
    def sandbox_id(self) -> str:
        """The pod's sandbox id, as a container runtime names it (the kubelet's words show it)."""
        return hashlib.sha256(f"sandbox/{self.uid}".encode()).hexdigest()


def sight(facts: PodFacts, life: PodLife,
          gpus: Mapping[str, tuple[GPU, ...]] | None = None) -> PodSight:
    """The pod as the engine knows it; ``gpus``: the GPUs each container holds
    (:func:`gpus_on`). A container runs as its status shows it running: the containers while
    the pod runs, a sidecar from its start until the pod ends, an init container while it is
    the one running."""
    held = gpus or {}
    phase = life.phase
    containers: list[ContainerSight] = []
    for index, (name, _, sidecar) in enumerate(facts.init_containers):
        running = (index < life.init_done and sidecar and phase not in podlife.TERMINAL) or \
            (index == life.init_done and phase == podlife.INITIALIZING)
        containers.append(ContainerSight(name, running, held.get(name, ())))
    for name, _ in facts.containers:
        containers.append(ContainerSight(name, phase == podlife.RUNNING, held.get(name, ())))
    return PodSight(facts.uid, facts.namespace, facts.name, facts.node, facts.labels,
                    facts.annotations,
                    phase in (podlife.INITIALIZING, podlife.RUNNING, podlife.BACKOFF),
                    tuple(containers))


def gpus_on(cluster: str, node: str, preset: str, indices: Iterable[int]) -> tuple[GPU, ...]:
    """GPUs ``indices`` of a node of ``preset`` (a GPU preset name) in ``cluster``."""
    model = PRODUCTS[preset].model_name
    return tuple(GPU(index, model, gpu_uuid(cluster, node, index)) for index in indices)


def nvidia_smi_list(gpus: Sequence[GPU]) -> str:
    """``nvidia-smi -L``: the GPUs the container sees, numbered from 0 as inside it."""
    return "".join(f"GPU {number}: {gpu.model} (UUID: {gpu.uuid})\n"
                   for number, gpu in enumerate(gpus))


# -- matching ---------------------------------------------------------------------------------

ScriptT = TypeVar("ScriptT", ExecScript, PortForwardRule)
#: A field's value for a pod and one of its containers (None: unset).
View = Callable[[PodSight, ContainerSight | None], str | None]

VIEWS: dict[str, View] = {
    "name": lambda pod, _: pod.name,
    "namespace": lambda pod, _: pod.namespace,
    "container": lambda _, container: container.name if container else None,
    "gpus": lambda _, container: str(len(container.gpus)) if container else None,
}


def _view(key: str) -> View:
    """The view of a selector's key: a field, or ``labels[KEY]``/``annotations[KEY]``."""
    for field in ("labels", "annotations"):
        if key.startswith(f"{field}[") and key.endswith("]"):
            name = key[len(field) + 1:-1]
            if field == "labels":
                return lambda pod, _: pod.labels.get(name)
            return lambda pod, _: pod.annotations.get(name)
    return VIEWS[key]


def _test(requirement: Requirement) -> Callable[[PodSight, ContainerSight | None], bool]:
    view = _view(requirement.key)
    holds = selectors.test(requirement.operator, requirement.values)
    return lambda pod, container: holds(view(pod, container))


def _compile(selector: Selector) -> Callable[[PodSight, ContainerSight | None], bool]:
    tests = [_test(requirement) for requirement in selector.matchExpressions]
    return lambda pod, container: all(test(pod, container) for test in tests)


@dataclasses.dataclass(frozen=True)
class _Rule(Generic[ScriptT]):
    script: ScriptT
    holds: Callable[[PodSight, ContainerSight | None], bool]


def _rules(scripts: Iterable[ScriptT]) -> tuple[_Rule[ScriptT], ...]:
    return tuple(_Rule(script, _compile(script.selector)) for script in scripts)


def words(command: Sequence[str]) -> tuple[str, ...]:
    """The words a command runs: those of ``sh -c "<text>"`` split as the shell splits them."""
    if len(command) >= 3 and os.path.basename(command[0]) in SHELLS and command[1] == "-c":
        try:
            inner = shlex.split(command[2])
        except ValueError:
            return tuple(command)
        if inner:
            return tuple(inner)
    return tuple(command)


def _same(wanted: Sequence[str], given: Sequence[str]) -> bool:
    """Whether ``given`` begins with ``wanted``, its first word also as a path ending in it."""
    if len(given) < len(wanted):
        return False
    if wanted and wanted[0] != given[0] and ("/" in wanted[0]
                                             or os.path.basename(given[0]) != wanted[0]):
        return False
    return list(wanted[1:]) == list(given[1:len(wanted)])


def _matches(script: ExecScript, argv: Sequence[str]) -> bool:
    if script.command is not None:
        return len(argv) == len(script.command) and _same(script.command, argv)
    return _same(script.commandPrefix or [], argv)


def render(text: str, pod: PodSight, container: ContainerSight, argv: Sequence[str]) -> str:
    """``text`` with its placeholders filled in
    (:data:`~operators.api.stages.EXEC_PLACEHOLDERS`)."""
    def fill(match: re.Match[str]) -> str:
        name, key = match.group(1), match.group(2)
        if key is not None:
            return (pod.labels if name == "labels" else pod.annotations).get(key, "")
        if name == "nvidiaSmiL":
            return nvidia_smi_list(container.gpus)
        return {"pod": pod.name, "namespace": pod.namespace, "container": container.name,
                "node": pod.node, "args": " ".join(argv[1:])}.get(name, match.group(0))
    return PLACEHOLDER.sub(fill, text)


def not_found(pod: PodSight, container: str, command: Sequence[str]) -> Outcome:
    """A command no script answers, as the container runtime fails it (runc's words under
    containerd's, approximately): a shell says it did not find it and exits 127."""
    argv = words(command)
    name = argv[0] if argv else ""
    shell = os.path.basename(command[0]) if command else ""
    if tuple(command) != argv:  # run by a shell, which exists
        said = (f"bash: line 1: {name}: command not found\n" if shell == "bash"
                else f"{shell}: 1: {name}: not found\n")
        return Outcome(stderr=said.encode(), code=127, command=tuple(command))
    exec_id = hashlib.sha256(f"exec/{pod.uid}/{container}/{command}".encode()).hexdigest()
    reason = (f"stat {name}: no such file or directory" if "/" in name
              else "executable file not found in $PATH")
    return Outcome(error=f'failed to exec in container: failed to start exec "{exec_id}": '
                         f'OCI runtime exec failed: exec failed: unable to start container '
                         f'process: exec: "{name}": {reason}: unknown',
                   command=tuple(command))


class Scripts:
    """A Lifecycle's exec scripts and port-forward rules, compiled once."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._exec = _rules(lifecycle.exec)
        self._ports = _rules(lifecycle.portForward)

    def exec(self, pod: PodSight, container: ContainerSight,
             command: Sequence[str]) -> Outcome:
        """What ``command`` does in ``container``: the first script that holds and matches
        (the pod's annotation first), else the runtime's failure."""
        try:
            own = _annotated(pod, keys.EXEC, ExecScript)
        except StageError as error:
            return Outcome(error=str(error), command=tuple(command))
        argv = words(command)
        for rule in (*own, *self._exec):
            if rule.holds(pod, container) and _matches(rule.script, argv):
                script = rule.script
                return Outcome(render(script.stdout, pod, container, argv).encode(),
                               render(script.stderr, pod, container, argv).encode(),
                               script.exitCode, delay=parse_duration(script.delay),
                               command=tuple(command))
        return not_found(pod, container.name, command)

    def reply(self, pod: PodSight, port: int) -> Reply | None:
        """What ``port`` answers (None: nothing listens on it); StageError when the pod's
        annotation is invalid."""
        for rule in (*_annotated(pod, keys.PORT_FORWARD, PortForwardRule), *self._ports):
            if port in rule.script.ports and rule.holds(pod, None):
                return answer(rule.script)
        return None


def answer(rule: PortForwardRule) -> Reply:
    if rule.raw is not None:
        return Reply(rule.raw.encode(), after_request=False)
    http = rule.http
    assert http is not None
    body = http.body.encode()
    try:
        phrase = HTTPStatus(http.status).phrase
    except ValueError:
        phrase = ""
    lines = [f"HTTP/1.1 {http.status} {phrase}".rstrip(), f"Content-Type: {http.contentType}",
             f"Content-Length: {len(body)}",
             *(f"{name}: {value}" for name, value in http.headers.items()),
             "Connection: close"]
    return Reply(("\r\n".join(lines) + "\r\n\r\n").encode() + body, after_request=True)


def _annotated(pod: PodSight, key: str, kind: type[ScriptT]) -> tuple[_Rule[ScriptT], ...]:
    text = pod.annotations.get(key)
    if not text:
        return ()
    return _rules(load_scripts(text, kind, source=f"annotation {key} of pod "
                                                  f"{pod.namespace}/{pod.name}"))
