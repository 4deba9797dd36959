"""Every numeric flag of every entry point is finite and within bounds, and refused otherwise
with the flag, the value and the range; the hub serves plaintext on loopback only."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from federation.hub.__main__ import main as hub
from federation.hub.__main__ import on_loopback
from federation.telemetry.collector import main as collector
from operators.__main__ import main as operator
from operators.cli import main as cli
from operators.controlplane.daemon import main as daemon
from operators.engine.__main__ import main as engine
from primitives.flags import integer, number


def test_a_number_is_finite_and_within_its_bounds() -> None:
    seconds = number(0.1, 60, "a number of seconds")
    assert seconds("0.1") == 0.1
    assert seconds("6e1") == 60
    for text in ("nan", "inf", "-inf", "0", "60.5", "two", ""):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            seconds(text)
        assert str(refused.value) == f"{text!r} is not a number of seconds from 0.1 to 60"


def test_a_whole_number_is_within_its_bounds() -> None:
    ports = integer(0, 65535, "a port")
    assert ports("0") == 0
    for text in ("-1", "65536", "1.5", "nan", "http"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"{text!r} is not a port from 0 "
                                                             f"to 65535"):
            ports(text)


def test_bounds_must_be_finite_and_in_order() -> None:
    for lo, hi in ((1.0, 0.0), (0.0, float("inf")), (float("nan"), 1.0)):
        with pytest.raises(ValueError, match="give finite bounds"):
            number(lo, hi)


Main = Callable[[list[str] | None], int]

HUB = ["--state-dir", "/nonexistent", "--insecure"]
COLLECTOR = ["--state-dir", "/nonexistent"]
OPERATOR = ["--state-dir", "/nonexistent"]
ENGINE = ["--kubeconfig", "/nonexistent"]
DAEMON = ["--state-dir", "/nonexistent"]

REFUSED: list[tuple[Main, list[str], str]] = [
    (hub, [*HUB, "--grace", "nan"],
     "argument --grace: 'nan' is not a number of seconds from 0.2 to 3600"),
    (hub, [*HUB, "--heartbeat-interval", "0"],
     "argument --heartbeat-interval: '0' is not a number of seconds from 0.1 to 60"),
    (hub, [*HUB, "--heartbeat-interval", "inf"], "'inf' is not a number of seconds"),
    (hub, [*HUB, "--heartbeat-interval", "5", "--grace", "5"],
     "--grace (5s) must be longer than --heartbeat-interval (5s)"),
    (collector, [*COLLECTOR, "--retention-interval", "nan"],
     "argument --retention-interval: 'nan' is not a number of seconds from 0.1 to 3600"),
    (collector, [*COLLECTOR, "--retention-hours", "-1"],
     "argument --retention-hours: '-1' is not a number of hours from 0.01 to 87600"),
    (collector, [*COLLECTOR, "--retention-hours", "inf"], "'inf' is not a number of hours"),
    (collector, [*COLLECTOR, "--retention-spans", "0"],
     "argument --retention-spans: '0' is not a whole number from 1 to 1000000000"),
    (collector, [*COLLECTOR, "--retention-mib", "0"],
     "argument --retention-mib: '0' is not a whole number from 1 to 1048576"),
    (operator, [*OPERATOR, "--cel-budget-ms", "nan"],
     "argument --cel-budget-ms: 'nan' is not a number of milliseconds from 1 to 60000"),
    (operator, [*OPERATOR, "--cel-memory-mib", "32"],
     "argument --cel-memory-mib: '32' is not a whole number from 64 to 1048576"),
    (engine, [*ENGINE, "--concurrency", "0"],
     "argument --concurrency: '0' is not a whole number from 1 to 1024"),
    (engine, [*ENGINE, "--kubelet-port", "70000"],
     "argument --kubelet-port: '70000' is not a port from 0 to 65535"),
    (engine, [*ENGINE, "--kubelet-tls-port", "-1"],
     "argument --kubelet-tls-port: '-1' is not a port from 0 to 65535"),
    (engine, [*ENGINE, "--kubelet-pki", "/nonexistent/kubelet"],
     "--kubelet-pki /nonexistent/kubelet: cannot read its CA: [Errno 2] No such file"),
    (engine, [*ENGINE, "--node-monitor-grace", "nan"],
     "argument --node-monitor-grace: 'nan' is not a number of seconds from 1 to 3600"),
    (daemon, [*DAEMON, "--startup-timeout", "nan"],
     "argument --startup-timeout: 'nan' is not a number of seconds from 1 to 3600"),
    (daemon, [*DAEMON, "--port", "0"], "argument --port: '0' is not a port from 1 to 65535"),
]


@pytest.mark.parametrize(("main", "argv", "message"), REFUSED,
                         ids=[" ".join(argv[2:]) for _, argv, _ in REFUSED])
def test_entry_points_refuse_numbers_they_cannot_use(
        main: Main, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "127.3.2.1:7000", "[::1]:7000",
                                    "localhost:7000", "LOCALHOST:1"])
def test_loopback_addresses_are_known(listen: str) -> None:
    assert on_loopback(listen)


@pytest.mark.parametrize("listen", ["0.0.0.0:7000", "[::]:7000", ":7000", "10.0.0.1:7000",
                                    "hub.example.com:443", "[::ffff:10.0.0.1]:1"])
def test_an_insecure_hub_off_loopback_is_refused(
        listen: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not on_loopback(listen)
    with pytest.raises(SystemExit):
        hub(["--state-dir", str(tmp_path), "--insecure", "--listen", listen])
    error = capsys.readouterr().err
    assert f"--insecure with --listen {listen}: without TLS" in error
    assert "serve plaintext on loopback only (127.0.0.1, ::1 or localhost)" in error


@pytest.mark.parametrize("argv", [
    ["up", "--timeout", "nan"], ["up", "--timeout", "-1"], ["wait", "--timeout", "inf"],
    ["fleet", "submit", "w.yaml", "--start-delay", "nan"],
    ["plan", "run", "p.yaml", "--timeout", "1e300"],
], ids=" ".join)
def test_the_cli_refuses_waits_that_are_no_number_of_seconds(argv: list[str]) -> None:
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2, result.output
    assert "is not a number of seconds from 0 to 604800" in result.output
