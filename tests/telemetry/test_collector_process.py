"""``python -m federation.telemetry.collector`` as the daemon runs it: it serves, stops on
SIGTERM, and refuses a store it cannot use with a message and an exit code."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from click.testing import CliRunner
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from federation.telemetry.files import CollectorFiles, CollectorInfo
from operators.cli.traces import trace
from tests.telemetry.test_collector import T0, otlp_span, request

COMMAND = [sys.executable, "-m", "federation.telemetry.collector"]


def test_it_serves_until_sigterm_and_leaves_its_spans(tmp_path: Path) -> None:
    files = CollectorFiles.of(tmp_path)
    process = subprocess.Popen([*COMMAND, "--state-dir", str(files.directory), "--unsafe-no-fsync"],
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while (info := CollectorInfo.read(files.info)) is None:
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, "the collector did not publish its address"
            time.sleep(0.05)
        assert info.pid == process.pid
        with grpc.insecure_channel(info.address) as channel:
            TraceServiceStub(channel).Export(  # type: ignore[no-untyped-call]
                request(otlp_span(b"\x05" * 16, b"\x01" * 8, "from afar", T0, T0 + 1)),
                timeout=10)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert f"collector serves OTLP/gRPC on {info.address}" in stderr
    assert not files.info.exists()
    listed = CliRunner().invoke(trace, ["ls", "-o", "json", "--state-dir", str(tmp_path)])
    assert [t["root"] for t in json.loads(listed.output)] == ["from afar"]


def test_a_broken_store_stops_it_with_a_message(tmp_path: Path) -> None:
    """(Its flags are checked with every entry point's, in tests/test_flags.py.)"""
    (tmp_path / "spans.db").write_bytes(b"\x00garbage" * 1000)
    broken = subprocess.run([*COMMAND, "--state-dir", str(tmp_path)], capture_output=True,
                            text=True, timeout=30)
    assert broken.returncode == 1
    assert "is not a usable span store" in broken.stderr
