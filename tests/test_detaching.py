"""Adopting a recorded process: who a pid is (/proc), the judgement, the record, a pidfd, and
Supervised.adopt with real (tiny) processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from operators.api.clusters import FakeCluster
from operators.controlplane import detaching, health
from operators.controlplane.detaching import Verdict, judge, read_record, write_record
from operators.controlplane.ports import free_port
from operators.controlplane.processes import Identity, Watched, identify, stat
from operators.controlplane.state import StateDir
from operators.controlplane.supervising import Supervised
from operators.handlers.clusters import adopting
from operators.reconciling import clusters as planning

SLEEP = ("sleep", "60")


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process of the test's own, as an earlier operator's member would be."""
    process = subprocess.Popen(SLEEP)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _identity_of(process: subprocess.Popen[bytes]) -> Identity:
    deadline = time.monotonic() + 5
    while (found := identify(process.pid)) is None or found.argv != SLEEP:  # exec'd yet?
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return found


def test_a_process_is_identified_by_its_start_time_and_command_line(
        sleeper: subprocess.Popen[bytes]) -> None:
    found = _identity_of(sleeper)
    fields = Path(f"/proc/{sleeper.pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert found == Identity(sleeper.pid, int(fields[19]), SLEEP)  # field 22 of the whole line
    fields_read = stat(sleeper.pid)
    assert fields_read is not None
    assert fields_read.parent == os.getpid()


def test_an_exited_process_has_no_identity(sleeper: subprocess.Popen[bytes]) -> None:
    sleeper.kill()
    time.sleep(0.1)
    assert identify(sleeper.pid) is None, "a zombie has exited"
    sleeper.wait()
    assert identify(sleeper.pid) is None


def test_a_command_name_with_parentheses_and_spaces_is_read(tmp_path: Path) -> None:
    entry = tmp_path / "42"
    entry.mkdir()
    fields = ["S", "7", *["0"] * 17, "123456", *["0"] * 30]
    (entry / "stat").write_text(f"42 (a) b (c) {' '.join(fields)}\n")
    (entry / "cmdline").write_bytes(b"a) b (c\0--flag\0")
    assert identify(42, tmp_path) == Identity(42, 123456, ("a) b (c", "--flag"))


RECORDED = Identity(100, 5000, ("kube-apiserver", "--secure-port=6443"))


@pytest.mark.parametrize(("found", "wanted", "verdict"), [
    (RECORDED, RECORDED.argv, Verdict.ADOPT),
    (RECORDED, ("kube-apiserver", "--secure-port=7443"), Verdict.OUTDATED),
    (None, RECORDED.argv, Verdict.GONE),
    (Identity(100, 9000, RECORDED.argv), RECORDED.argv, Verdict.GONE),  # pid reused
    (Identity(100, 5000, ("bash",)), RECORDED.argv, Verdict.GONE),  # pid reused, same tick
])
def test_only_the_recorded_process_is_adopted(found: Identity | None, wanted: tuple[str, ...],
                                              verdict: Verdict) -> None:
    assert judge(RECORDED, found, wanted) is verdict


def test_a_record_is_read_back_and_a_torn_one_is_none(tmp_path: Path) -> None:
    path = detaching.record_path(tmp_path / "kube-apiserver.log")
    assert path == tmp_path / "kube-apiserver.process.json"
    write_record(path, RECORDED)
    assert read_record(path) == RECORDED
    assert path.stat().st_mode & 0o077 == 0
    path.write_text('{"pid": 100, "startTi')
    assert read_record(path) is None
    assert read_record(tmp_path / "none.json") is None


@pytest.mark.parametrize(("value", "parent", "found"), [
    ("4242", 4242, 4242),
    ("4242", 17, None),  # inherited from further up: the daemon is not this one's parent
    ("", 4242, None),
    ("-1", 4242, None),
])
def test_children_are_detached_only_under_a_parent_that_is_a_subreaper(
        value: str, parent: int, found: int | None) -> None:
    assert detaching.subreaper({detaching.SUBREAPER: value}, parent) == found
    assert detaching.subreaper({}, parent) is None


async def test_a_pidfd_sees_the_exit_and_signals_only_that_process(
        sleeper: subprocess.Popen[bytes]) -> None:
    watched = Watched(sleeper.pid)
    assert watched.running
    watched.send_signal(signal.SIGTERM)
    await asyncio.wait_for(watched.wait(), 5)
    assert not watched.running
    assert sleeper.wait() == -signal.SIGTERM  # its parent reads the code
    with pytest.raises(ProcessLookupError):
        watched.send_signal(signal.SIGKILL)
    await asyncio.wait_for(watched.wait(), 1)  # again: at once


def test_a_pid_that_names_no_process_cannot_be_watched() -> None:
    process = subprocess.Popen(["true"])
    process.wait()
    with pytest.raises(ProcessLookupError):
        Watched(process.pid)


def _supervised(tmp_path: Path, argv: tuple[str, ...] = SLEEP) -> Supervised:
    return Supervised("sleeper", argv, log_path=tmp_path / "sleeper.log")


async def test_a_process_running_as_recorded_is_adopted_and_stopped_through_its_pidfd(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    child = _supervised(tmp_path)
    write_record(child.record, _identity_of(sleeper))
    assert await child.adopt()
    assert child.adopted
    assert child.pid == sleeper.pid
    assert child.supervised
    await child.stop(timeout=5)
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
    assert child.pid is None
    assert not child.record.exists()


async def test_an_adopted_process_that_exits_is_started_anew(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    child = Supervised("sleeper", SLEEP, log_path=tmp_path / "sleeper.log", min_backoff=0.05)
    write_record(child.record, _identity_of(sleeper))
    assert await child.adopt()
    sleeper.kill()
    deadline = time.monotonic() + 10
    while child.pid in (None, sleeper.pid):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    assert child.restarts == 1
    assert not child.adopted
    await child.stop()


async def test_a_reused_pid_is_never_adopted_nor_signalled(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    child = _supervised(tmp_path)
    found = _identity_of(sleeper)
    write_record(child.record, Identity(found.pid, found.start_time - 1, found.argv))
    assert not await child.adopt()
    assert not child.supervised
    assert child.pid is None
    assert not child.record.exists(), "a record of nothing that runs is forgotten"
    assert sleeper.poll() is None, "the process that has the pid now is left alone"


async def test_a_recorded_process_started_otherwise_than_now_is_stopped(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    child = _supervised(tmp_path, ("sleep", "61"))
    write_record(child.record, _identity_of(sleeper))
    assert not await child.adopt()
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
    assert not child.record.exists()


async def test_a_record_of_a_process_that_exited_is_forgotten(tmp_path: Path) -> None:
    child = _supervised(tmp_path)
    process = await asyncio.create_subprocess_exec("true")
    await process.wait()
    write_record(child.record, Identity(process.pid, 1, SLEEP))
    assert not await child.adopt()
    assert not child.record.exists()


async def test_without_a_record_nothing_is_adopted(tmp_path: Path) -> None:
    assert not await _supervised(tmp_path).adopt()


async def test_stopping_a_child_never_started_leaves_the_record_alone(tmp_path: Path) -> None:
    """The record is another supervisor's to judge: forgetting it would leave its process
    running unrecorded, holding its ports for good."""
    child = _supervised(tmp_path)
    write_record(child.record, RECORDED)
    await child.stop()
    assert read_record(child.record) == RECORDED


def test_a_restarted_operator_that_adopts_everything_keeps_the_cluster_ready(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """What the planner would start after a restart runs already: nothing is missing, so the
    FakeCluster is not reported NotReady meanwhile (as it is when a process must start)."""
    state = StateDir(tmp_path)
    cluster = FakeCluster.model_validate({
        "metadata": {"name": "west", "namespace": "default"}, "spec": {}})
    actions = planning.plan(cluster, planning.Observed())
    running = _identity_of(sleeper)
    logs = [state.component_log("default.west", kind) for kind in
            ("kube-apiserver", "kube-scheduler", "kube-controller-manager")]
    logs.append(state.engine_log("default.west"))
    for log in logs:
        log.parent.mkdir(parents=True, exist_ok=True)
        write_record(detaching.record_path(log), running)
    assert adopting(state, cluster, "default.west", actions)
    detaching.record_path(logs[-1]).unlink()  # the engine must start
    assert not adopting(state, cluster, "default.west", actions)
    assert not adopting(state, cluster, "default.west", [planning.BuildRelease()])


async def test_an_adopted_process_that_does_not_answer_is_stopped_to_start_anew(
        tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    child = _supervised(tmp_path)
    write_record(child.record, _identity_of(sleeper))
    assert not await health.adopt(child, f"http://127.0.0.1:{free_port()}/healthz",
                                  timeout=0.5)
    assert sleeper.wait(timeout=5) == -signal.SIGTERM
    assert not child.supervised


async def test_asking_whether_it_runs_from_another_thread_changes_nothing() -> None:
    """Supervised.pid is read from threads too (a test's poll, a status): the answer closes
    no descriptor behind the loop's back, and closing twice closes once."""
    process = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        watched = Watched(process.pid)
        pidfd = watched._pidfd
        assert pidfd is not None
        assert await asyncio.to_thread(lambda: watched.running)
        process.kill()
        await process.wait()
        assert not await asyncio.to_thread(lambda: watched.running)
        os.fstat(pidfd)  # still open: the loop's reader (or close) owns it
        await asyncio.wait_for(watched.wait(), 5)
        watched.close()
        watched.close()
        assert not watched.running
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
