"""Supervision with real (tiny) processes: restart, stop, and no orphans."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from operators.controlplane.supervising import Supervised, tail


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[-1][:1] != "Z"


async def _eventually(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_crashed_child_is_restarted_and_logged(tmp_path: Path) -> None:
    log = tmp_path / "sleep.log"
    child = Supervised("sleeper", ["sleep", "60"], log_path=log, min_backoff=0.05)
    await child.start()
    first = child.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await _eventually(lambda: child.pid not in (None, first))
    assert child.restarts == 1
    assert tail(log).count("starting sleeper") == 2
    await child.stop()
    assert not _alive(first)
    assert child.pid is None


async def test_stop_escalates_to_kill(tmp_path: Path) -> None:
    stubborn = [sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)"]
    child = Supervised("stubborn", stubborn, log_path=tmp_path / "s.log")
    await child.start()
    pid = child.pid
    assert pid is not None
    await _eventually(lambda: "ready" in tail(tmp_path / "s.log"))
    started = time.monotonic()
    await child.stop(timeout=0.5)
    assert time.monotonic() - started < 5
    assert not _alive(pid)


def test_children_die_with_a_killed_supervisor(tmp_path: Path) -> None:
    """SIGKILL the supervising process: its child must not stay behind as an orphan."""
    script = tmp_path / "supervisor.py"
    script.write_text(
        "import asyncio, pathlib, sys\n"
        "from operators.controlplane.supervising import Supervised\n"
        "async def main():\n"
        f"    log = pathlib.Path({str(tmp_path)!r}) / 'c.log'\n"
        "    child = Supervised('s', ['sleep', '60'], log_path=log)\n"
        "    await child.start()\n"
        "    print(child.pid, flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    supervisor = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert supervisor.stdout is not None
    child = int(supervisor.stdout.readline())
    assert _alive(child)
    supervisor.kill()
    supervisor.wait()
    supervisor.stdout.close()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_tail_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert tail(tmp_path / "none.log") == ""


@pytest.mark.parametrize("lines", [1, 3])
def test_tail_returns_last_lines(tmp_path: Path, lines: int) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    assert tail(log, lines).splitlines() == [f"line {i}" for i in range(10 - lines, 10)]


async def test_backoff_grows_while_crashing_and_resets_after_a_healthy_run(
        tmp_path: Path) -> None:
    """A crash after a healthy run waits the shortest back-off again, not the longest of an
    earlier crash loop."""
    starts = tmp_path / "starts"
    # Runs 1-4 crash at once; run 5 is healthy for 0.6 s (> stable_after), then crashes.
    script = (f"date +%s.%N >> {starts}; n=$(wc -l < {starts}); "
              f"[ $n -eq 5 ] && sleep 0.6; [ $n -ge 6 ] && sleep 60; exit 1")
    child = Supervised("flaky", ["sh", "-c", script], log_path=tmp_path / "f.log",
                       min_backoff=0.1, max_backoff=5.0, stable_after=0.5)
    await child.start()
    try:
        await _eventually(lambda: starts.exists() and
                          len(starts.read_text().split()) >= 6, timeout=15)
    finally:
        await child.stop()
    times = [float(line) for line in starts.read_text().split()]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # Crash loop: 0.1, 0.2, 0.4, 0.8 s of back-off between the runs (plus a process start) ...
    for gap, backoff in zip(gaps[:4], [0.1, 0.2, 0.4, 0.8], strict=True):
        assert backoff <= gap < backoff + 0.25, gaps
    # ... then 0.6 s of health, and the shortest back-off again (not 1.6 s).
    assert 0.6 + 0.1 <= gaps[4] < 0.6 + 0.1 + 0.25, gaps


async def test_a_restart_that_cannot_start_is_tried_again(tmp_path: Path) -> None:
    """Defect: one failed respawn (the binary gone for a moment) ended supervision for good."""
    program = tmp_path / "program"
    program.write_text("#!/bin/sh\nexec sleep 60\n")
    program.chmod(0o755)
    child = Supervised("program", [str(program)], log_path=tmp_path / "p.log",
                       min_backoff=0.05, max_backoff=0.2)
    await child.start()
    first = child.pid
    assert first is not None
    program.rename(tmp_path / "away")
    os.kill(first, signal.SIGKILL)
    await _eventually(lambda: child.pid is None)
    await asyncio.sleep(0.5)  # several failed starts
    assert child.pid is None
    (tmp_path / "away").rename(program)
    await _eventually(lambda: child.pid not in (None, first))
    assert child.restarts == 1
    await child.stop()


async def test_a_child_gets_its_variables_on_top_of_ours_and_keeps_them_across_restarts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKEFLEET_TEST_INHERITED", "inherited")
    log = tmp_path / "env.log"
    child = Supervised("env", ["sh", "-c", "echo $FAKEFLEET_TEST_INHERITED $OTEL_X; exit 1"],
                       log_path=log, min_backoff=0.05, env={"OTEL_X": "given"})
    await child.start()
    await _eventually(lambda: child.restarts >= 1 and tail(log).count("inherited given") >= 2)
    await child.stop()


async def test_nothing_of_the_supervisor_runs_between_fork_and_exec(tmp_path: Path) -> None:
    """A supervisor with threads (gRPC's) must not run code in a forked child: Python's fork
    handlers (and gRPC's with them) run there only if a ``preexec_fn`` makes Python fork
    instead of vfork. The handler below would leave a file behind if it ran."""
    marker = tmp_path / "ran-in-child"

    def leave_marker() -> None:
        with contextlib.suppress(OSError):  # registered for good: later forks find no dir
            marker.touch()

    os.register_at_fork(after_in_child=leave_marker)
    child = Supervised("sleeper", ["sleep", "60"], log_path=tmp_path / "s.log")
    await child.start()
    try:
        pid = child.pid
        assert pid is not None
        await _eventually(lambda: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep"))
        assert not marker.exists()
    finally:
        await child.stop()


async def test_a_missing_program_is_refused_before_anything_starts(tmp_path: Path) -> None:
    child = Supervised("ghost", [str(tmp_path / "no-such-binary")], log_path=tmp_path / "g.log")
    with pytest.raises(FileNotFoundError, match="no-such-binary"):
        await child.start()
    assert child.pid is None


async def test_a_crash_is_logged_with_the_last_words_of_the_child(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dying = [sys.executable, "-c", "import sys; print('cannot bind 127.0.0.1:9443', "
                                   "flush=True); sys.exit(1)"]
    child = Supervised("dying", dying, log_path=tmp_path / "d.log", min_backoff=5.0)
    await child.start()
    try:
        await _eventually(lambda: "exited with code 1" in caplog.text)
        assert "cannot bind 127.0.0.1:9443" in caplog.text
    finally:
        await child.stop()
