"""bench.scrapelog: metrics-server's log read back into rounds, each failure classified by the
error Go reported (the log lines are metrics-server v0.8.0's at --v=1)."""

from __future__ import annotations

import pytest

from bench.scrapelog import Round, go_duration, kind, rounds

URL = r'Get \"http://127.64.0.3:40123/metrics/resource\"'


def failed(node: str, error: str, *, timeout: bool = False) -> str:
    message = "Failed to scrape node, timeout to access kubelet" if timeout \
        else "Failed to scrape node"
    extra = ' timeout="5s"' if timeout else ""
    return (f'E1203 07:48:05.123456   41234 scraper.go:147] "{message}" err="{URL}: {error}" '
            f'node="{node}"{extra}')


def started(at: str, count: int) -> str:
    return (f'I1203 {at}   41234 scraper.go:121] "Scraping metrics from nodes" '
            f'nodes=["cpu-0","cpu-1"] nodeCount={count} nodeSelector="fakefleet.dev/pool"')


def finished(duration: str, count: int) -> str:
    return (f'I1203 07:48:14.000001   41234 scraper.go:182] "Scrape finished" '
            f'duration="{duration}" nodeCount={count} podCount={2 * count}')


@pytest.mark.parametrize(("error", "timeout", "expected"), [
    ("context deadline exceeded", True, "timeout"),
    ("net/http: request canceled (Client.Timeout exceeded while awaiting headers)", False,
     "timeout"),
    ("dial tcp 127.64.0.3:40123: i/o timeout", False, "timeout"),
    ("read tcp 127.0.0.1:51234->127.64.0.3:40123: read: connection reset by peer", False,
     "reset"),
    ("dial tcp 127.64.0.3:40123: connect: connection refused", False, "refused"),
    ("EOF", False, "eof"),
    (r'request failed, status: \"404 Not Found\"', False, "other"),
])
def test_each_failure_is_classified_by_go_s_error(error: str, timeout: bool,
                                                   expected: str) -> None:
    assert kind(failed("cpu-1", error, timeout=timeout)) == expected


def test_go_durations_are_read_in_seconds() -> None:
    assert go_duration("8.503211237s") == pytest.approx(8.503211237)
    assert go_duration("1m2.5s") == pytest.approx(62.5)
    assert go_duration("850ms") == pytest.approx(0.85)
    assert go_duration("12.5µs") == pytest.approx(12.5e-6)


def test_rounds_are_read_whole_and_cut_ones_left_out() -> None:
    log = "\n".join([
        failed("cpu-9", "EOF"),  # the end of a round whose start is not in the text
        finished("9.1s", 5990),
        started("07:48:00.000123", 6000),
        'I1203 07:48:01.1   41234 reflector.go:376] "Caches populated"',
        failed("cpu-1", "context deadline exceeded", timeout=True),
        failed("cpu-2", "context deadline exceeded", timeout=True),
        failed("cpu-3", "read: connection reset by peer"),
        finished("8.503211237s", 5997),
        started("07:48:15.000456", 6000),
        finished("4.2s", 6000),
        started("07:48:30.000789", 6000),  # not finished when the text was read
        failed("cpu-4", "EOF"),
    ])
    first, second = rounds(log)
    assert first == Round("07:48:00.000123", 6000, 5997, pytest.approx(8.503211237),
                          {"timeout": 2, "reset": 1, "refused": 0, "eof": 0, "other": 0})
    assert first.success == pytest.approx(5997 / 6000)
    assert (second.at, second.scraped, second.success) == ("07:48:15.000456", 6000, 1.0)
    assert sum(second.failures.values()) == 0
