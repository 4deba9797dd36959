"""Which exec, attach and port-forward requests the engine takes over, and how it refuses the
others: the kubelet's statuses and words, in the kubelet's order, so that the API server and
kubectl say what they say for a real node (and fall back from a WebSocket to SPDY)."""

from __future__ import annotations

import pytest

from operators.engine.responding import Answer
from tests.engine.streamingkit import Pods, answer, connect, pod

EXEC = "/exec/default/trainer/main?command=true&output=1"


@pytest.mark.parametrize(("target", "given", "expected"), [
    ("/exec/default/trainer/main?command=true", {},
     Answer(400, b"you must specify at least 1 of stdin, stdout, stderr")),
    ("/exec/default/nobody/main?command=true&output=1", {},
     Answer(404, b"pod does not exist")),
    ("/exec/default/trainer/other-uid/main?command=true&output=1", {},
     Answer(500, b'container not found ("main")')),
    ("/exec/default/trainer/nope?command=true&output=1", {},
     Answer(500, b'container not found ("nope")')),
    ("/attach/default/trainer/nope?output=1", {},
     Answer(500, b"container nope not found in pod trainer_default")),
    (EXEC, {"connection": "", "upgrade": ""}, Answer(500, b"Upgrade request required\n")),
    (EXEC, {"protocols": []},
     Answer(400, b"unable to upgrade: header X-Stream-Protocol-Version does not exist in "
                 b"request with 2 headers\n")),
    (EXEC, {"protocols": [" , "]},
     Answer(400, b"unable to upgrade: header X-Stream-Protocol-Version contains [,], but "
                 b"no valid protocols\n")),
    (EXEC, {"protocols": ["v5.channel.k8s.io"]},
     Answer(403, b"unable to upgrade: unable to negotiate protocol: client supports "
                 b"[v5.channel.k8s.io], server accepts [v4.channel.k8s.io v3.channel.k8s.io "
                 b"v2.channel.k8s.io channel.k8s.io]\n")),
    (EXEC, {"upgrade": "websocket"},
     Answer(400, b'unable to upgrade: missing upgrade headers in request: http.Header{'
                 b'"Connection":[]string{"Upgrade"}, "Upgrade":[]string{"websocket"}}\n')),
    (EXEC, {"method": "PUT"}, Answer(405, b"405: Method Not Allowed")),
    ("/exec/default/trainer", {}, Answer(404, b"404: Page Not Found")),
    ("/exec/default//main", {}, Answer(404, b"404: Page Not Found")),
    ("/portForward/default/nobody", {}, Answer(404, b"pod does not exist")),
    ("/portForward/default/trainer/other-uid", {}, Answer(404, b"pod not found")),
    ("/portForward/default/trainer", {"protocols": ["v4.channel.k8s.io"]},
     Answer(403, b"unable to upgrade: unable to negotiate protocol: client supports "
                 b"[v4.channel.k8s.io], server accepts [portforward.k8s.io]\n")),
])
def test_refusals_carry_the_kubelets_status_and_words(target: str, given: dict[str, object],
                                                      expected: Answer) -> None:
    assert answer(Pods(pod()), target, **given) == expected


def test_a_container_that_does_not_run_cannot_be_exec_d_into_nor_attached_to() -> None:
    stopped = Pods(pod(running=False))
    assert answer(stopped, EXEC) == Answer(500, b'container not found ("main")')
    assert answer(stopped, "/attach/default/trainer/main?output=1") == \
        Answer(500, b"container main not found in pod trainer_default")


def test_a_pod_without_a_running_sandbox_cannot_be_forwarded_to() -> None:
    assert answer(Pods(pod(sandbox=False)), "/portForward/default/trainer",
                  protocols=["portforward.k8s.io"]) == \
        Answer(500, b'pod not found ("trainer_default")')


def test_the_pods_uid_in_the_path_may_be_given() -> None:
    connected = connect(Pods(pod(uid="abc")), "/exec/default/trainer/abc/main?command=true&"
                                              "output=1", method="GET")
    assert connected.switch.head == (b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade"
                                     b"\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: "
                                     b"v4.channel.k8s.io\r\n\r\n")
    connect(Pods(pod(uid="abc")), "/portForward/default/trainer/abc",
            protocols=["portforward.k8s.io"])


def test_a_pod_on_another_node_does_not_exist_here() -> None:
    elsewhere = pod()
    pods = Pods()
    pods.pods[("other-node", elsewhere.namespace, elsewhere.name)] = elsewhere
    assert answer(pods, EXEC) == Answer(404, b"pod does not exist")
