"""``kubectl exec`` and ``attach`` on fake pods, as client-go's SPDY executor drives them: the
streams it opens, what comes back on each, in the order it reads them, and the status that
makes kubectl print and exit as it does."""

from __future__ import annotations

import json

from operators.api.stages import ExecScript
from operators.engine import remotecommand, spdy
from operators.engine.remotecommand import Outcome, go_json
from operators.engine.scripting import Scripts
from operators.engine.stages import default_lifecycle
from primitives import keys
from tests.engine.spdyclient import Frame, status_of, stream_data
from tests.engine.streamingkit import GPUS, Connected, Pods, connect, pod

EXEC = "/exec/default/trainer/main"


def command(*words: str, flags: str = "input=1&output=1&error=1") -> str:
    return EXEC + "?" + "&".join(f"command={word}" for word in words) + "&" + flags


def open_streams(connected: Connected, *, stdin: bool = True, stderr: bool = True,
                 resize: bool = False) -> list[Frame]:
    """client-go's order: error (half-closed at once), stdin, stdout, stderr, resize."""
    client = connected.client
    wire = client.syn_stream(1, {"streamtype": "error"}) + client.data(1, b"", fin=True)
    kinds = [kind for kind, wanted in (("stdin", stdin), ("stdout", True), ("stderr", stderr),
                                       ("resize", resize)) if wanted]
    for index, kind in enumerate(kinds):
        wire += client.syn_stream(3 + 2 * index, {"streamtype": kind})
    return connected.send(wire)


def test_nvidia_smi_lists_the_gpus_the_container_holds_with_the_published_uuids() -> None:
    connected = connect(Pods(pod()), command("nvidia-smi", "-L"))
    assert connected.switch.head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n" in connected.switch.head
    frames = open_streams(connected)
    stdout = stream_data(frames, 5).decode()
    assert stdout == (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {GPUS[0].uuid})\n"
                      f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {GPUS[1].uuid})\n")
    assert status_of(frames, 1) == {"status": "Success"}
    # What client-go reads in order: stdout and stderr end, then the status, then the end.
    ends = [(frame.kind, frame.stream) for frame in frames if frame.fin or frame.kind in (3, 7)]
    assert ends == [(0, 5), (0, 7), (0, 1), (3, 3), (7, 7)]
    assert frames[-1].word == 0
    assert connected.link.closed


def test_a_megabyte_of_output_arrives_whole_with_no_window_granted() -> None:
    lifecycle = default_lifecycle().model_copy(update={"exec": [ExecScript(
        name="dump", command=["dump"], stdout="0123456789abcdef" * 65536)]})
    connected = connect(Pods(pod()), command("dump"), scripts=Scripts(lifecycle))
    frames = open_streams(connected)
    stdout = [frame for frame in frames if frame.kind == 0 and frame.stream == 5]
    assert b"".join(frame.data for frame in stdout) == b"0123456789abcdef" * 65536
    assert max(len(frame.data) for frame in stdout) == spdy.CHUNK
    assert status_of(frames, 1) == {"status": "Success"}


def test_a_non_zero_exit_code_is_the_status_kubectl_exits_with() -> None:
    connected = connect(Pods(pod()), command("false"))
    frames = open_streams(connected)
    assert status_of(frames, 1) == {
        "status": "Failure",
        "message": "command terminated with non-zero exit code: error executing command "
                   "[false], exit code 1",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "1"}]}}


def test_an_unknown_command_fails_as_the_runtime_fails_it() -> None:
    connected = connect(Pods(pod()), command("nosuch", "--flag"))
    status = status_of(open_streams(connected), 1)
    assert status["reason"] == "InternalError"
    assert status["code"] == 500
    message = str(status["message"])
    assert message.startswith("Internal error occurred: error executing command in container: "
                              "failed to exec in container: failed to start exec \"")
    assert message.endswith('exec: "nosuch": executable file not found in $PATH: unknown')


def test_a_shell_that_does_not_find_a_command_says_so_and_exits_127() -> None:
    connected = connect(Pods(pod()), command("sh", "-c", "nosuch%20arg"))
    frames = open_streams(connected)
    assert stream_data(frames, 7) == b"sh: 1: nosuch: not found\n"
    assert status_of(frames, 1)["details"] == {"causes": [{"reason": "ExitCode",
                                                            "message": "127"}]}


def test_a_command_run_by_a_shell_is_matched_by_its_words() -> None:
    connected = connect(Pods(pod()), command("/bin/sh", "-c", "hostname"))
    assert stream_data(open_streams(connected), 5) == b"trainer\n"


def test_stdin_is_read_and_dropped() -> None:
    connected = connect(Pods(pod()), command("echo", "hi"))
    client = connected.client
    wire = client.syn_stream(1, {"streamtype": "error"}) + client.data(1, b"", fin=True) + \
        client.syn_stream(3, {"streamtype": "stdin"}) + client.data(3, b"ignored input")
    frames = connected.send(wire)
    assert [frame.kind for frame in frames] == [2, 2]  # waits for stdout and stderr
    frames = connected.send(client.syn_stream(5, {"streamtype": "stdout"}) +
                            client.syn_stream(7, {"streamtype": "stderr"}))
    assert stream_data(frames, 5) == b"hi\n"
    assert status_of(frames, 1) == {"status": "Success"}


def test_a_tty_shows_everything_on_the_terminal_with_carriage_returns() -> None:
    annotated = pod(annotations={keys.EXEC: json.dumps([{
        "name": "both", "command": ["report"], "stdout": "one\ntwo\n", "stderr": "oops\n"}])})
    connected = connect(Pods(annotated), command("report", flags="input=1&output=1&error=1&tty=1"))
    # With a TTY there is no stderr stream, and a resize stream comes last.
    frames = open_streams(connected, stderr=False, resize=True)
    assert stream_data(frames, 5) == b"one\r\ntwo\r\noops\r\n"
    assert status_of(frames, 1) == {"status": "Success"}
    connected = connect(Pods(annotated), command("report", flags="input=1&output=1&error=1&tty=1"))
    frames = connected.send(connected.client.syn_stream(1, {"streamtype": "error"}) +
                            connected.client.syn_stream(3, {"streamtype": "stdin"}) +
                            connected.client.syn_stream(5, {"streamtype": "stdout"}))
    assert not connected.link.closed  # the resize stream is still awaited
    frames = connected.send(connected.client.syn_stream(7, {"streamtype": "resize"}) +
                            connected.client.data(7, b'{"Width":80,"Height":24}'))
    assert stream_data(frames, 5) == b"one\r\ntwo\r\noops\r\n"


def test_older_protocols_carry_a_failure_as_text_and_v1_nothing() -> None:
    for protocol, expected in (("v3.channel.k8s.io", b"command terminated with non-zero exit "
                                                     b"code: error executing command [false], "
                                                     b"exit code 1"),
                               ("v2.channel.k8s.io", b"command terminated with non-zero exit "
                                                     b"code: error executing command [false], "
                                                     b"exit code 1"),
                               ("channel.k8s.io", b"")):
        connected = connect(Pods(pod()), command("false"), protocols=[protocol])
        assert f"X-Stream-Protocol-Version: {protocol}".encode() in connected.switch.head
        frames = open_streams(connected)
        assert stream_data(frames, 1) == expected, protocol
    connected = connect(Pods(pod()), command("true"), protocols=["v2.channel.k8s.io"])
    assert stream_data(open_streams(connected), 1) == b""


def test_the_first_protocol_the_client_offers_is_chosen() -> None:
    connected = connect(Pods(pod()), command("true"),
                        protocols=["v5.channel.k8s.io", "v3.channel.k8s.io,v4.channel.k8s.io"])
    assert b"X-Stream-Protocol-Version: v3.channel.k8s.io\r\n" in connected.switch.head


def test_a_client_that_never_opens_its_streams_is_let_go_after_30_s() -> None:
    connected = connect(Pods(pod()), command("true"))
    connected.send(connected.client.syn_stream(1, {"streamtype": "error"}))
    assert connected.advance(29.0) == []
    frames = connected.advance(1.0)
    assert frames[-1].kind == 7
    assert connected.link.closed
    assert connected.timers.pending == 0


def test_a_script_with_a_delay_answers_after_it() -> None:
    slow = pod(annotations={keys.EXEC: json.dumps([{
        "name": "slow", "commandPrefix": ["sleep"], "delay": "5s"}])})
    connected = connect(Pods(slow), command("sleep", "5"))
    frames = open_streams(connected)
    assert all(frame.kind == 2 for frame in frames)
    assert all(frame.kind != 7 for frame in connected.advance(4.9))
    frames = connected.advance(0.1)
    assert status_of(frames, 1) == {"status": "Success"}


def test_a_client_gone_midway_leaves_nothing_waiting() -> None:
    slow = pod(annotations={keys.EXEC: json.dumps([{
        "name": "slow", "command": ["wait"], "delay": "1h"}])})
    connected = connect(Pods(slow), command("wait"))
    open_streams(connected)
    connected.switch.session.connection_lost()
    assert connected.timers.pending == 0


def test_an_invalid_exec_annotation_is_named_in_the_error() -> None:
    broken = pod(annotations={keys.EXEC: '[{"name": "x", "command": []}]'})
    status = status_of(open_streams(connect(Pods(broken), command("true"))), 1)
    assert "annotation fakefleet.dev/exec of pod default/trainer is invalid: 0.command" in \
        str(status["message"])


def test_attach_waits_for_the_container_to_stop_then_succeeds() -> None:
    pods = Pods(pod())
    connected = connect(pods, "/attach/default/trainer/main?output=1&error=1")
    frames = open_streams(connected, stdin=False)
    assert [frame.kind for frame in frames] == [2, 2, 2]
    assert connected.advance(10.0) == []
    pods.put(pod(running=False))
    frames = connected.advance(remotecommand.ATTACH_POLL)
    assert stream_data(frames, 3) == b""
    assert status_of(frames, 1) == {"status": "Success"}
    assert connected.link.closed
    assert connected.timers.pending == 0


def test_go_json_escapes_as_go_does() -> None:
    assert go_json({"m": "a<b>&c é"}) == '{"m":"a\\u003cb\\u003e\\u0026c é"}'.encode()
    assert remotecommand.status(Outcome(error="boom")) == {
        "status": "Failure", "message": "Internal error occurred: error executing command in "
                                        "container: boom",
        "reason": "InternalError", "code": 500}
