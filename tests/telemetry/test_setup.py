"""The SDK set-up of entry points, and the variables the daemon hands its children."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from federation.telemetry import exporting, setup
from federation.telemetry.files import CollectorFiles
from operators.cli.traces import trace
from operators.controlplane.daemon import collector_wanted
from operators.controlplane.errors import StateError
from tests.telemetry.collectors import running_collector


@pytest.fixture
def clean_otel_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    return monkeypatch


async def test_a_configured_process_exports_to_the_endpoint_in_its_environment(
        tmp_path: Path, clean_otel_environment: pytest.MonkeyPatch) -> None:
    async with running_collector(CollectorFiles.of(tmp_path).directory) as info:
        for name, value in exporting.exporter_environment(info.endpoint, os.environ).items():
            clean_otel_environment.setenv(name, value)
        provider = setup.configure("fakefleet-engine", "west", set_global=False)
        with provider.get_tracer("test").start_as_current_span("engine.batch"):
            pass
        assert await asyncio.to_thread(provider.force_flush, 10_000)
        await asyncio.to_thread(provider.shutdown)
    [listed] = json.loads(CliRunner().invoke(
        trace, ["ls", "-o", "json", "--state-dir", str(tmp_path)]).output)
    assert (listed["root"], listed["services"], listed["clusters"]) == (
        "engine.batch", ["fakefleet-engine"], ["west"])
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "fakefleet-engine"
    assert attributes["k8s.cluster.name"] == "west"
    assert attributes["service.instance.id"]


def test_without_an_endpoint_spans_are_made_but_not_exported(
        clean_otel_environment: pytest.MonkeyPatch) -> None:
    provider = setup.configure("fakefleet-hub", set_global=False)
    assert "k8s.cluster.name" not in provider.resource.attributes
    assert not exporting.exporting(os.environ)
    with provider.get_tracer("test").start_as_current_span("sampled") as span:
        assert span.get_span_context().trace_flags.sampled  # parent-based, always on
    provider.shutdown()


def test_the_users_endpoint_wins_over_the_collector() -> None:
    collector = "http://127.0.0.1:4317"
    assert exporting.exporter_environment(collector, {}) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    for name in exporting.ENDPOINT_VARIABLES:
        assert exporting.exporter_environment(collector, {name: "http://tempo:4317"}) == {}
    assert not exporting.exporting({"OTEL_EXPORTER_OTLP_ENDPOINT": collector,
                                "OTEL_SDK_DISABLED": "true"})
    assert not exporting.exporting({"OTEL_EXPORTER_OTLP_ENDPOINT": collector,
                                "OTEL_TRACES_EXPORTER": "none"})


def test_fakefleet_collector_is_on_or_off_and_nothing_else() -> None:
    assert collector_wanted({})
    assert collector_wanted({"FAKEFLEET_COLLECTOR": "on"})
    assert not collector_wanted({"FAKEFLEET_COLLECTOR": "OFF"})
    with pytest.raises(StateError, match="FAKEFLEET_COLLECTOR='no' is neither 'on' nor 'off'"):
        collector_wanted({"FAKEFLEET_COLLECTOR": "no"})


def test_the_entry_point_configures_once_and_shutdown_lets_it_again(
        clean_otel_environment: pytest.MonkeyPatch) -> None:
    installed: list[object] = []
    # The API's global provider can be set once per process: this test must not take it.
    clean_otel_environment.setattr(setup.trace, "set_tracer_provider", installed.append)
    provider = setup.configure("fakefleet-operator")
    assert installed == [provider]
    with pytest.raises(RuntimeError, match="already configured"):
        setup.configure("fakefleet-operator")
    setup.shutdown()
    setup.shutdown()  # a second shutdown is harmless
    again = setup.configure("fakefleet-operator")
    assert installed == [provider, again]
    setup.shutdown()


def test_a_protocol_other_than_grpc_is_warned_about(
        clean_otel_environment: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clean_otel_environment.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    clean_otel_environment.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    provider = setup.configure("fakefleet-hub", set_global=False)
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf is not supported" in caplog.text
    provider.shutdown()
