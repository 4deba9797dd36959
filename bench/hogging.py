"""A reproducible slowdown for benchmarks: one busy process pinned to one core (``taskset``),
for as long as the ``with`` block runs.

On this project's two-core machines that takes half the CPU the API server, the controllers and
the engine share, every run the same way, instead of waiting for a slow day.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

#: What the hog runs: a Python loop that never sleeps.
BUSY_LOOP = "while True: pass"


@contextlib.contextmanager
def hog(enabled: bool = True) -> Iterator[int | None]:
    """Run a busy loop pinned to the last core while the block runs; yields its pid (None when
    ``enabled`` is False)."""
    if not enabled:
        yield None
        return
    taskset = shutil.which("taskset")
    if taskset is None:
        raise SystemExit("--hog needs taskset (util-linux) to pin the busy process to one core")
    core = (os.cpu_count() or 1) - 1
    process = subprocess.Popen([taskset, "-c", str(core), sys.executable, "-c", BUSY_LOOP])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()
