"""Exec scripts and port-forward rules: their schema in the Lifecycle and the annotations,
how a command is matched and its output rendered, which containers run, and the GPUs a
container holds named as DCGM and the ResourceSlices name them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from operators.api.gpus import gpu_uuid
from operators.api.stages import (
    ExecScript,
    PortForwardRule,
    StageError,
    load_lifecycle,
    load_scripts,
)
from operators.engine import pods as podlife
from operators.engine.nodes import NodeLife
from operators.engine.pods import PodFacts, PodLife
from operators.engine.scripting import (
    ContainerSight,
    PodSight,
    Scripts,
    gpus_on,
    nvidia_smi_list,
    sight,
    words,
)
from operators.engine.stages import default_lifecycle
from operators.engine.usage import UsageBook
from operators.metrics.dcgm import PRODUCTS
from primitives import keys
from tests.test_usage_book import SPEC, T0, book, gpu_pod, running

LIFECYCLE = """
apiVersion: fakefleet.dev/v1alpha1
kind: Lifecycle
stages:
- {name: run, resource: Pod, effect: {phase: Running}}
"""


def lifecycle(extra: str) -> str:
    return LIFECYCLE + extra


def test_a_lifecycle_carries_exec_scripts_and_port_forward_rules() -> None:
    loaded = load_lifecycle(lifecycle("""
exec:
- name: ls
  selector: {matchExpressions: [{key: container, operator: In, values: [main]}]}
  command: [ls, /]
  stdout: "bin\\netc\\n"
portForward:
- {name: web, ports: [80, 8080], http: {body: ok}}
"""))
    assert [script.name for script in loaded.exec] == ["ls"]
    assert loaded.portForward[0].ports == [80, 8080]


@pytest.mark.parametrize(("extra", "problem"), [
    ("exec: [{name: a, stdout: x}]", "give command (the whole command) or commandPrefix"),
    ("exec: [{name: a, command: [x], commandPrefix: [x]}]", "one of them"),
    ("exec: [{name: a, command: []}]", "at least 1 item"),
    ("exec: [{name: a, command: [x], stdout: '{gpu}'}]", "placeholder '{gpu}' is not known"),
    ("exec: [{name: a, command: [x], exitCode: 256}]", "less than or equal to 255"),
    ("exec: [{name: a, command: [x], selector: {phases: [Running]}}]", "running containers"),
    ("exec: [{name: a, command: [x], selector: {matchExpressions: "
     "[{key: phase, operator: Exists}]}}]", "'phase' is not a pod or container field"),
    ("exec: [{name: a, command: [x]}, {name: a, command: [y]}]",
     "two exec scripts are named 'a'"),
    ("portForward: [{name: p, ports: [80]}]", "give http (an HTTP response) or raw"),
    ("portForward: [{name: p, ports: [], raw: x}]", "at least 1 item"),
    ("portForward: [{name: p, ports: [70000], raw: x}]", "less than or equal to 65535"),
    ("portForward: [{name: p, ports: [80], http: {headers: {'a b': c}}}]",
     "a name is a token"),
    ("portForward: [{name: p, ports: [80], http: {headers: {a: \"b\\r\\nc: d\"}}}]",
     "a value one line"),
    ("portForward: [{name: p, ports: [80], raw: x, selector: {matchExpressions: "
     "[{key: container, operator: Exists}]}}]", "'container' is not a pod field"),
])
def test_what_cannot_be_run_is_refused_naming_the_place(extra: str, problem: str) -> None:
    with pytest.raises(StageError) as raised:
        load_lifecycle(lifecycle(extra))
    assert problem in str(raised.value)


def test_an_annotation_holds_a_list_in_the_same_schema() -> None:
    (script,) = load_scripts('[{"name": "a", "command": ["x"], "stdout": "{\\"j\\": 1}"}]',
                             ExecScript, source="annotation x")
    assert script.stdout == '{"j": 1}', "braces that are no placeholder are text"
    with pytest.raises(StageError, match="annotation x is invalid: the document: Input should "
                                         "be a valid list"):
        load_scripts('{"name": "a"}', PortForwardRule, source="annotation x")
    with pytest.raises(StageError, match="not valid JSON: "):
        load_scripts("[", ExecScript, source="annotation x")


GPU_POD = PodSight("uid-1", "ml", "trainer-0", "gpu-0", {"team": "a"}, {"model": "llama"},
                   True, (ContainerSight("main", True, gpus_on("west", "gpu-0",
                                                                "B200", [3, 1])),
                          ContainerSight("idle", True)))


def run(pod: PodSight, container: str, *command: str, scripts: Scripts | None = None) -> Any:
    chosen = pod.container(container)
    assert chosen is not None
    return (scripts or Scripts(default_lifecycle())).exec(pod, chosen, command)


def test_nvidia_smi_names_the_model_and_uuids_the_cluster_publishes() -> None:
    outcome = run(GPU_POD, "main", "nvidia-smi", "-L")
    model = PRODUCTS["B200"].model_name
    assert outcome.stdout.decode() == (
        f"GPU 0: {model} (UUID: {gpu_uuid('west', 'gpu-0', 3)})\n"
        f"GPU 1: {model} (UUID: {gpu_uuid('west', 'gpu-0', 1)})\n")
    assert outcome.code == 0
    assert not outcome.error
    assert run(GPU_POD, "main", "/usr/bin/nvidia-smi", "-L").stdout == outcome.stdout
    # A container without GPUs has no nvidia-smi: the NVIDIA runtime did not put one there.
    assert "executable file not found" in run(GPU_POD, "idle", "nvidia-smi", "-L").error
    assert nvidia_smi_list(()) == ""


def test_placeholders_are_filled_from_the_pod_and_the_command() -> None:
    scripts = Scripts(load_lifecycle(lifecycle("""
exec:
- name: whoami
  commandPrefix: [whoami]
  stdout: "{namespace}/{pod}/{container} on {node}: {args} {labels[team]}
    {annotations[model]}|{labels[none]}|"
""")))
    outcome = run(GPU_POD, "main", "whoami", "a", "b", scripts=scripts)
    assert outcome.stdout == b"ml/trainer-0/main on gpu-0: a b a llama||"


def test_the_annotation_comes_before_the_lifecycle() -> None:
    annotated = PodSight(GPU_POD.uid, GPU_POD.namespace, GPU_POD.name, GPU_POD.node,
                         GPU_POD.labels, {keys.EXEC: json.dumps([
                             {"name": "mine", "command": ["hostname"], "stdout": "special\n",
                              "exitCode": 3}])}, True, GPU_POD.containers)
    outcome = run(annotated, "main", "hostname")
    assert (outcome.stdout, outcome.code) == (b"special\n", 3)
    assert run(GPU_POD, "main", "hostname").stdout == b"trainer-0\n"


def test_selectors_see_the_container_and_its_gpus() -> None:
    scripts = Scripts(load_lifecycle(lifecycle("""
exec:
- name: gpu-main
  selector:
    matchExpressions:
    - {key: container, operator: In, values: [main]}
    - {key: gpus, operator: In, values: ["2"]}
    - {key: "labels[team]", operator: In, values: [a]}
  command: [probe]
  stdout: "gpu\\n"
- {name: other, command: [probe], stdout: "other\\n"}
""")))
    assert run(GPU_POD, "main", "probe", scripts=scripts).stdout == b"gpu\n"
    assert run(GPU_POD, "idle", "probe", scripts=scripts).stdout == b"other\n"


def test_commands_are_matched_word_for_word_and_through_a_shell() -> None:
    assert words(["sh", "-c", "nvidia-smi -L"]) == ("nvidia-smi", "-L")
    assert words(["/bin/bash", "-c", "echo 'a b'"]) == ("echo", "a b")
    assert words(["sh", "-c", "unbalanced '"]) == ("sh", "-c", "unbalanced '")
    assert words(["python", "-c", "x"]) == ("python", "-c", "x")
    assert run(GPU_POD, "main", "echo", "a", "b").stdout == b"a b\n"
    assert "executable file" in run(GPU_POD, "main", "nvidia-smi", "-L", "-x").error
    bash = run(GPU_POD, "main", "bash", "-c", "nosuch")
    assert (bash.stderr, bash.code) == (b"bash: line 1: nosuch: command not found\n", 127)
    path = run(GPU_POD, "main", "/opt/nosuch")
    assert 'exec: "/opt/nosuch": stat /opt/nosuch: no such file or directory' in path.error


def test_a_port_answers_by_the_first_rule_that_names_it() -> None:
    scripts = Scripts(load_lifecycle(lifecycle("""
portForward:
- name: team-a
  ports: [80]
  raw: "a"
  selector: {matchExpressions: [{key: "labels[team]", operator: In, values: [a]}]}
- {name: any, ports: [80, 443], http: {status: 418, body: tea}}
""")))
    team = scripts.reply(GPU_POD, 80)
    assert team is not None
    assert team.data == b"a"
    tea = scripts.reply(GPU_POD, 443)
    assert tea is not None
    assert tea.after_request
    assert tea.data == (b"HTTP/1.1 418 I'm a Teapot\r\nContent-Type: text/plain; charset=utf-8"
                        b"\r\nContent-Length: 3\r\nConnection: close\r\n\r\ntea")
    assert scripts.reply(GPU_POD, 22) is None


def test_which_containers_run_follows_the_pods_life() -> None:
    facts = PodFacts({"metadata": {"uid": "u", "namespace": "ns", "name": "p"},
                      "spec": {"nodeName": "n", "containers": [{"name": "app"}],
                               "initContainers": [{"name": "setup"},
                                                  {"name": "proxy", "restartPolicy": "Always"},
                                                  {"name": "migrate"}]}})

    def running_ones(life: PodLife) -> list[str]:
        seen = sight(facts, life)
        return [c.name for c in seen.containers if c.running] + (["sandbox"] if seen.sandbox
                                                                  else [])
    assert running_ones(PodLife()) == []
    assert running_ones(PodLife(phase=podlife.INITIALIZING, init_finished=("t",))) == [
        "proxy", "sandbox"]
    assert running_ones(PodLife(phase=podlife.INITIALIZING, init_finished=("t", "t"))) == [
        "proxy", "migrate", "sandbox"]
    assert running_ones(PodLife(phase=podlife.RUNNING, init_finished=("t",) * 3)) == [
        "proxy", "app", "sandbox"]
    assert running_ones(PodLife(phase=podlife.BACKOFF, init_finished=("t",) * 3)) == [
        "proxy", "sandbox"], "crash-looping: the sandbox and sidecar stay"
    assert running_ones(PodLife(phase=podlife.SUCCEEDED, init_finished=("t",) * 3)) == []


def test_the_gpus_a_container_holds_are_those_the_dcgm_series_show() -> None:
    usage: UsageBook = book()
    first, second = gpu_pod("a", 3), gpu_pod("b", 2)
    usage.seen(first, running(T0), T0)
    usage.seen(second, running(T0), T0)
    assert usage.held(second.uid, 8, NodeLife()) == {"trainer": (3, 4)}
    samples = list(usage.gpu_samples("c", "gpu-0", SPEC, NodeLife(), T0 + 1))
    assert [s.index for s in samples if s.holder and s.holder.pod == "b"] == [3, 4]
    assert [s.uuid for s in samples if s.holder and s.holder.pod == "b"] == [
        gpu.uuid for gpu in gpus_on("c", "gpu-0", "H100-SXM5-80GB", [3, 4])]
    assert usage.held("nobody", 8, NodeLife()) == {}
