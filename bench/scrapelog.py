"""metrics-server's log read back: each scrape round, how many nodes it scraped, and why the
others failed. Pure: text in, rounds out (``bench.usage`` does the I/O).

metrics-server v0.8.0 at ``--v=1`` logs the start of each round with the nodes it is about to
scrape (``"Scraping metrics from nodes" ... nodeCount=N``) and its end with the nodes it got a
reading from (``"Scrape finished" duration=... nodeCount=M``); in between, one error line per
node it failed (``"Failed to scrape node..." err="..."``). Rounds never overlap: the next
starts on a tick after the last has finished (pkg/server/server.go, pkg/scraper/scraper.go).

Failures are classified by the error Go reports:

- ``timeout``: its per-node deadline (``--kubelet-request-timeout``) passed, ``context
  deadline exceeded`` (logged "timeout to access kubelet"), or the client's own
  (``Client.Timeout``, ``i/o timeout``);
- ``reset``: ``connection reset by peer``;
- ``refused``: ``connection refused``;
- ``eof``: the connection closed before an answer (``EOF``);
- ``other``: anything else (an HTTP status, an unreadable body).
"""

from __future__ import annotations

import dataclasses
import re

KINDS = ("timeout", "reset", "refused", "eof", "other")
STARTED = '"Scraping metrics from nodes"'
FINISHED = '"Scrape finished"'
FAILED = '"Failed to scrape node'
#: klog's header: level, date, time (``I1203 07:48:01.123456``).
HEADER = re.compile(r"^[IWEF]\d{4} (\d\d:\d\d:\d\d\.\d+)")
NODE_COUNT = re.compile(r"\bnodeCount=(\d+)")
DURATION = re.compile(r'\bduration="?([0-9.]+[a-zµ]+(?:[0-9.]+[a-zµ]+)*)"?')
#: Go's time.Duration units, in seconds.
UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
PART = re.compile(r"([0-9.]+)(h|ms|m|s|us|µs|ns)")


@dataclasses.dataclass
class Round:
    """One scrape round of every node."""

    at: str  # klog's time of its start (local time, HH:MM:SS.micros)
    nodes: int  # nodes it set out to scrape
    scraped: int = 0  # nodes it got a reading from
    seconds: float = 0.0  # how long it took, as metrics-server measured
    failures: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(KINDS, 0))

    @property
    def success(self) -> float:
        """The share of nodes scraped (1.0 for a round of no nodes)."""
        return self.scraped / self.nodes if self.nodes else 1.0


def kind(line: str) -> str:
    """Which failure a "Failed to scrape node" line reports (one of :data:`KINDS`)."""
    if "context deadline exceeded" in line or "Client.Timeout" in line or \
            "timeout to access kubelet" in line or "i/o timeout" in line:
        return "timeout"
    if "connection reset" in line:
        return "reset"
    if "connection refused" in line:
        return "refused"
    if "EOF" in line:
        return "eof"
    return "other"


def go_duration(text: str) -> float:
    """Seconds of a Go duration string (``1m2.5s``, ``850ms``)."""
    return sum(float(amount) * UNITS[unit] for amount, unit in PART.findall(text))


def rounds(text: str) -> list[Round]:
    """The rounds ``text`` holds from their start to their end; a round cut off at either end
    of the text is left out, and so are failures outside a round."""
    done: list[Round] = []
    current: Round | None = None
    for line in text.splitlines():
        if STARTED in line:
            header = HEADER.match(line)
            count = NODE_COUNT.search(line)
            current = Round(header.group(1) if header else "",
                            int(count.group(1)) if count else 0)
        elif current is None:
            continue
        elif FAILED in line:
            current.failures[kind(line)] += 1
        elif FINISHED in line:
            count = NODE_COUNT.search(line)
            duration = DURATION.search(line)
            current.scraped = int(count.group(1)) if count else 0
            current.seconds = go_duration(duration.group(1)) if duration else 0.0
            done.append(current)
            current = None
    return done
