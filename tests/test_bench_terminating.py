"""SIGTERM stops a benchmark as Ctrl-C does: what it started is stopped before it exits, in
asyncio.run and outside it, also when started in the background with SIGINT ignored."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import bench

#: A benchmark in miniature: a child process, stopped in a finally (as Substrate and the
#: engine harness stop theirs); it says its pid once inside the try.
SCRIPT = """
import asyncio, contextlib, signal, subprocess, sys, time
from bench.terminating import sigterm_interrupts

CHILD = [sys.executable, "-c", "import time; time.sleep(60)"]

async def run():
    child = await asyncio.create_subprocess_exec(*CHILD)
    try:
        print(child.pid, flush=True)
        await asyncio.sleep(60)
    finally:
        child.terminate()
        await child.wait()

@contextlib.contextmanager
def started():
    child = subprocess.Popen(CHILD)
    try:
        print(child.pid, flush=True)
        yield
    finally:
        child.terminate()
        child.wait()

if sys.argv[2] == "background":  # as a shell starts a background job
    signal.signal(signal.SIGINT, signal.SIG_IGN)
sigterm_interrupts()
if sys.argv[1] == "async":
    asyncio.run(run())
else:
    with started():
        time.sleep(60)
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.parametrize("started", ["foreground", "background"])
def test_sigterm_stops_what_the_run_started(mode: str, started: str) -> None:
    with subprocess.Popen([sys.executable, "-c", SCRIPT, mode, started],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          cwd=Path(bench.__file__).parent.parent) as process:
        try:
            assert process.stdout is not None
            child = int(process.stdout.readline())
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=15)
            deadline = time.monotonic() + 5
            while not gone(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert gone(child), "the run's child outlived it"
        finally:
            process.kill()


def test_every_benchmark_stops_on_sigterm_as_on_ctrl_c() -> None:
    """Each ``python -m bench.X`` says so first thing (or after its internal sub-modes)."""
    missing = []
    for path in sorted(Path(bench.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        main = next((node for node in tree.body
                     if isinstance(node, ast.FunctionDef) and node.name == "main"), None)
        if main is None:
            continue
        calls = {node.func.id for node in ast.walk(main)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        if "sigterm_interrupts" not in calls:
            missing.append(path.name)
    assert not missing
