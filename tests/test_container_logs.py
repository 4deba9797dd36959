"""Container logs computed from a script and a run's times (operators.engine.logs), as golden
lines: the window a request's tail, since and timestamps ask for, a run that ended, a
previous run; and the scripts' validation (operators.api.logs)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from operators.api.logs import LogLines, load_log_lines
from operators.api.stages import StageError, load_lifecycle
from operators.engine import logs
from operators.engine.logs import NS, Context, Options, Refusal, Run, Timeline
from operators.engine.pods import UNLOCATED, Exit, PodFacts, PodLife, render_status
from operators.k8s.times import rfc3339
from tests.engine.harness import pod

T0 = 1_767_225_600 * NS  # 2026-01-01T00:00:00Z
CONTEXT = Context(pod="web", namespace="default", container="main", node="cpu-0", gpus=2,
                  labels={"app": "vllm"}, annotations={"model": "llama"}, seed="default/web")
SCRIPT = {
    "start": ["starting {pod} on {node}",
              {"after": "3s", "text": "loaded {annotations[model]} on {gpus} GPU(s)"}],
    "every": {"interval": "10s", "lines": ["step {n}", "load {rand:1..9}"]},
    "exit": ["exited {exitCode} ({reason}) after run {restart}"],
}


def timeline(script: dict[str, Any] = SCRIPT, *, finished: float | None = None,
             code: int = 0, reason: str = "", restart: int = 0) -> Timeline:
    run = Run("containerd://1", T0, None if finished is None else T0 + round(finished * NS),
              restart, code, reason)
    return Timeline(logs.compile_script(LogLines.model_validate(script)), run, CONTEXT)


def text(line: Timeline, now: float, **options: Any) -> str:
    wanted = Options(**options)
    begin, end = logs.window(line, wanted, T0 + round(now * NS))
    body, reached = logs.take(line, begin, end, timestamps=wanted.timestamps, size=1 << 20)
    assert reached == end
    return body.decode()


def test_a_running_container_shows_what_it_wrote_by_now() -> None:
    assert text(timeline(), 35).splitlines() == [
        "starting web on cpu-0",
        "loaded llama on 2 GPU(s)",
        "step 1",
        "load 1",
        "step 3",
    ]
    assert text(timeline(), 2.9) == "starting web on cpu-0\n", "the next line is 3 s in"


def test_timestamps_are_rfc3339_with_nine_digits_and_a_space() -> None:
    assert text(timeline(), 10, timestamps=True).splitlines() == [
        "2026-01-01T00:00:00.000000000Z starting web on cpu-0",
        "2026-01-01T00:00:03.000000000Z loaded llama on 2 GPU(s)",
        "2026-01-01T00:00:10.000000000Z step 1",
    ]
    assert logs.format_time(T0 + 1) == "2026-01-01T00:00:00.000000001Z"


def test_tail_takes_the_last_lines_and_zero_takes_none() -> None:
    assert text(timeline(), 35, tail=2) == "load 1\nstep 3\n"
    assert text(timeline(), 35, tail=0) == ""
    assert text(timeline(), 35, tail=100).count("\n") == 5


def test_since_skips_the_lines_before_it_and_tail_counts_within() -> None:
    assert text(timeline(), 35, since=T0 + 15 * NS) == "load 1\nstep 3\n"
    assert text(timeline(), 35, since=T0 + 20 * NS) == "load 1\nstep 3\n", "at since: kept"
    assert text(timeline(), 35, since=T0 + 20 * NS + 1) == "step 3\n"
    assert text(timeline(), 35, since=T0 + 15 * NS, tail=1) == "step 3\n"
    assert text(timeline(), 35, since=T0 + 99 * NS) == "", "since in the future"


def test_a_run_that_ended_stops_at_its_end_with_its_exit_lines() -> None:
    ended = timeline(finished=25, code=1, reason="Error", restart=2)
    expected = ["starting web on cpu-0", "loaded llama on 2 GPU(s)", "step 1", "load 3",
                "exited 1 (Error) after run 2"]
    assert text(ended, 3600).splitlines() == expected, "nothing after the end"
    assert ended.count(T0 + 3600 * NS) == 5
    assert text(ended, 3600, tail=1, timestamps=True) == \
        "2026-01-01T00:00:25.000000000Z exited 1 (Error) after run 2\n"
    early = timeline(finished=2, code=137, reason="OOMKilled")
    assert text(early, 60) == "starting web on cpu-0\nexited 137 (OOMKilled) after run 0\n", \
        "a start line after the end is never written"


def test_a_start_line_comes_before_a_periodic_line_of_the_same_time() -> None:
    tied = timeline({"start": [{"after": "10s", "text": "ready"}, "begin"],
                     "every": {"interval": "5s", "lines": ["tick {n}"]}})
    assert text(tied, 10).splitlines() == ["begin", "tick 1", "ready", "tick 2"]


def test_lines_written_stay_where_they_are_as_time_goes_on() -> None:
    """Positions are stable: what a follower took is a prefix of what comes later, also once
    the run ends."""
    jittered = {"start": ["a", {"after": "25s", "text": "b"}],
                "every": {"interval": "10s", "jitter": "9s", "lines": ["t{n}"]},
                "exit": ["end"]}
    running = timeline(jittered)
    later = [running.count(T0 + s * NS) for s in range(0, 200, 7)]
    assert later == sorted(later)
    everything = list(running.lines(0, running.count(T0 + 200 * NS)))
    assert [at for at, _ in everything] == sorted(at for at, _ in everything)
    for k, (at, line) in enumerate(item for item in everything if item[1].startswith("t")):
        assert T0 + (k + 1) * 10 * NS <= at < T0 + (k + 1) * 10 * NS + 9 * NS, line
    ended = timeline(jittered, finished=100)
    cut = ended.count(T0 + 100 * NS)
    assert list(ended.lines(0, cut - 1)) == everything[:cut - 1]
    assert list(ended.lines(cut - 1, cut)) == [(T0 + 100 * NS, "end")]
    assert list(timeline(jittered).lines(3, 6)) == everything[3:6], "the same seed, the same"


def test_random_values_are_the_pod_s_own_and_stay_in_bounds() -> None:
    script = {"every": {"interval": "1s", "lines": ["{rand:200..202}"]}}
    values = [line for _, line in timeline(script).lines(0, 200)]
    assert set(values) == {"200", "201", "202"}
    other = Timeline(timeline(script).script, timeline(script).run,
                     dataclasses.replace(CONTEXT, seed="other"))
    assert [line for _, line in other.lines(0, 200)] != values
    assert [line for _, line in timeline(script, restart=1).lines(0, 200)] != values, \
        "each run draws anew"


def test_an_empty_script_and_a_periodic_only_script_count_right() -> None:
    empty = Timeline(logs.Script(frozenset(), (), 0, 0, (), ()), timeline().run, CONTEXT)
    assert empty.count(T0 + 3600 * NS) == 0
    assert empty.time_at(0) is None
    periodic = timeline({"every": {"interval": "100ms", "lines": ["x"]}})
    assert periodic.count(T0 + 3600 * NS) == 36000
    assert periodic.time_at(36000) == T0 + 36001 * NS // 10


# -- which run, and the kubelet's words when there is none -------------------------------------

def facts() -> PodFacts:
    body = pod("web", "cpu-0")
    body["metadata"]["uid"] = "u1"
    return PodFacts(body)


def status(life: PodLife) -> dict[str, Any]:
    return render_status(facts(), life, rfc3339(T0 / NS))


STARTED = "2026-01-01T00:00:00Z"
CRASH = Exit(1, "Error", "", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z")


def test_the_current_run_is_the_running_container_and_previous_the_last_one() -> None:
    running = PodLife(phase="Running", started_at="2026-01-01T00:02:00Z", restarts=1,
                      last_exit=CRASH)
    current = logs.run_of(status(running), "web", "main", previous=False)
    assert current == Run(render_status(facts(), running, "")["containerStatuses"][0]
                          ["containerID"], T0 + 120 * NS, None, 1)
    last = logs.run_of(status(running), "web", "main", previous=True)
    assert isinstance(last, Run)
    assert (last.started, last.finished, last.restart, last.exit_code, last.reason) == (
        T0, T0 + 60 * NS, 0, 1, "Error")


def test_a_crash_looping_container_shows_its_last_run() -> None:
    waiting = PodLife(phase="BackOff", restarts=1, last_exit=CRASH)
    shown = logs.run_of(status(waiting), "web", "main", previous=False)
    assert isinstance(shown, Run)
    assert shown.finished == T0 + 60 * NS


@pytest.mark.parametrize(("life", "previous", "refusal"), [
    (PodLife(), False,
     'container "main" in pod "web" is waiting to start: PodInitializing'),
    (PodLife(waiting=("ContainerCreating", "")), False,
     'container "main" in pod "web" is waiting to start: ContainerCreating'),
    (PodLife(waiting=("ImagePullBackOff", "")), False,
     'container "main" in pod "web" is waiting to start: trying and failing to pull image'),
    (PodLife(waiting=("ErrImagePull", "")), False,
     'container "main" in pod "web" is waiting to start: image can\'t be pulled'),
    (PodLife(phase="Running", started_at=STARTED), True,
     'previous terminated container "main" in pod "web" not found'),
    (PodLife(phase="Failed", exit=UNLOCATED, reason="Evicted", message="low on memory"),
     False, 'container "main" in pod "web" is terminated'),
])
def test_the_kubelet_s_words_when_there_is_no_such_run(life: PodLife, previous: bool,
                                                        refusal: str) -> None:
    assert logs.run_of(status(life), "web", "main", previous=previous) == Refusal(400, refusal)


def test_a_followed_run_is_found_again_ended_or_not_at_all() -> None:
    running = PodLife(phase="Running", started_at=STARTED)
    followed = logs.run_of(status(running), "web", "main", previous=False)
    assert isinstance(followed, Run)
    assert logs.run_again(status(running), "main", followed) == followed
    crashed = PodLife(phase="BackOff", restarts=1, last_exit=Exit(
        2, "Error", "", STARTED, "2026-01-01T00:00:30Z"))
    ended = logs.run_again(status(crashed), "main", followed)
    assert ended is not None
    assert (ended.finished, ended.exit_code) == (T0 + 30 * NS, 2)
    again = PodLife(phase="Running", started_at="2026-01-01T00:01:00Z", restarts=2,
                    last_exit=CRASH)
    assert logs.run_again(status(again), "main", followed) is None, "two runs later"


# -- options ---------------------------------------------------------------------------------

def test_options_are_decoded_and_checked_as_the_kubelet_does() -> None:
    assert logs.parse_options({"follow": ["true"], "tailLines": ["5"],
                               "timestamps": ["1"]}, T0) == Options(
        follow=True, tail=5, timestamps=True)
    assert logs.parse_options({"tail": ["7"]}, T0) == Options(tail=7), "the older spelling"
    assert logs.parse_options({"sinceSeconds": ["60"]}, T0) == Options(since=T0 - 60 * NS)
    assert logs.parse_options({"sinceTime": ["2026-01-01T00:00:10Z"]}, T0) == Options(
        since=T0 + 10 * NS)
    for undecodable in ({"follow": ["yes"]}, {"tailLines": ["x"]},
                        {"sinceTime": ["yesterday"]}):
        assert logs.parse_options(undecodable, T0) == logs.UNDECODABLE
    for invalid in ({"tailLines": ["-1"]}, {"limitBytes": ["0"]}, {"sinceSeconds": ["0"]},
                    {"sinceSeconds": ["5"], "sinceTime": ["2026-01-01T00:00:10Z"]},
                    {"stream": ["Both"]}, {"stream": ["Stdout"], "tailLines": ["1"]}):
        assert logs.parse_options(invalid, T0) == logs.INVALID, invalid


# -- scripts ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("script", "problem"), [
    ('{"start": ["{bogus}"]}', "unknown placeholder {bogus}; known: {pod}"),
    ('{"start": ["a { b"]}', "a lone '{' at character 2: write {{ for a literal brace"),
    ('{"start": ["code {exitCode}"]}', "{exitCode} has a value in `exit` lines only"),
    ('{"exit": ["line {n}"]}', "{n} has a value in `every` lines only"),
    ('{"every": {"interval": "10ms", "lines": ["x"]}}', "interval 10ms is shorter than 100ms"),
    ('{"every": {"interval": "1s", "jitter": "1s", "lines": ["x"]}}',
     "jitter 1s is not less than the interval 1s"),
    ('{"start": ["{rand:9..1}"]}', "A..B needs A <= B"),
    ('{"start": ["two\\nlines"]}', "a line has no line break"),
    ('{"containers": ["main"]}', "the script writes nothing"),
    ('{"start": [{"text": "x", "after": "soon"}]}', "start.0.after: String should match"),
    ("start: [", "is neither JSON nor YAML"),
])
def test_a_script_that_cannot_render_is_refused_with_what_to_fix(script: str,
                                                                  problem: str) -> None:
    with pytest.raises(ValueError, match=r"annotation fakefleet\.dev/logs") as refused:
        load_log_lines(script, source="annotation fakefleet.dev/logs")
    assert problem in str(refused.value)


def test_literal_braces_and_yaml_scripts_load() -> None:
    script = load_log_lines("start: ['{{\"level\": \"info\"}} {pod}']", source="a")
    line = Timeline(logs.compile_script(script), timeline().run, CONTEXT)
    assert [text for _, text in line.lines(0, 1)] == ['{"level": "info"} web']


def test_the_lifecycle_s_log_scripts_are_named_and_select_pods() -> None:
    head = ("apiVersion: fakefleet.dev/v1alpha1\nkind: Lifecycle\nstages:\n"
            "- {name: s, resource: Pod, effect: {delete: true}}\n")
    lifecycle = load_lifecycle(head + "logs:\n- {name: a, start: [x], selector: "
                               "{matchExpressions: [{key: job, operator: In, values: "
                               "['true']}]}}\n")
    assert [script.name for script in lifecycle.logs] == ["a"]
    with pytest.raises(StageError, match="two log scripts are named 'a'"):
        load_lifecycle(head + "logs:\n- {name: a, start: [x]}\n- {name: a, start: [y]}\n")
    with pytest.raises(StageError, match="phases are for stages"):
        load_lifecycle(head + "logs:\n- {name: a, start: [x], selector: {phases: [Running]}}\n")
    with pytest.raises(StageError, match="key 'colour' is not a pod field"):
        load_lifecycle(head + "logs:\n- {name: a, start: [x], selector: {matchExpressions: "
                              "[{key: colour, operator: Exists}]}}\n")
