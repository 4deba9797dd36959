"""``python -m federation.hub``: run the federation hub until SIGTERM/SIGINT.

It sets up the OpenTelemetry SDK for the process (service ``fakefleet-hub``, exporting where
the ``OTEL_*`` variables say) and flushes what is buffered before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import sys
from pathlib import Path

from federation.client.tokens import TokenError
from federation.hub.core import MAX_LIVE_WORKLOADS, HubSettings
from federation.hub.server import ServeSettings, Tls, serve
from federation.telemetry import setup
from primitives.flags import integer, number

SECONDS = "a number of seconds"


def on_loopback(listen: str) -> bool:
    """Whether ``host:port`` (or ``[v6]:port``) is reachable from this machine only."""
    host = listen.rpartition(":")[0].removeprefix("[").removesuffix("]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, or nothing (every interface)
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m federation.hub",
                                     description="The fakefleet federation hub.")
    parser.add_argument("--state-dir", type=Path, required=True,
                        help="where the hub keeps its key, state and hub.json")
    parser.add_argument("--listen", default="127.0.0.1:0",
                        help="host:port to serve on (default: loopback, a free port)")
    parser.add_argument("--tls-cert", type=Path, help="serving certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    parser.add_argument("--tls-ca", type=Path, help="the CA that signed it (given to clients)")
    parser.add_argument("--insecure", action="store_true",
                        help="serve without TLS (tests and benchmarks; only with a loopback "
                             "--listen)")
    # Heartbeats more often than 10 a second come close to a busy loop; a grace of an hour
    # already leaves a dead member listed Ready for that long.
    parser.add_argument("--heartbeat-interval", type=number(0.1, 60, SECONDS), default=2.0,
                        help="seconds between heartbeats, both ways, from 0.1 to 60 "
                             "(default 2)")
    parser.add_argument("--grace", type=number(0.2, 3600, SECONDS), default=6.0,
                        help="seconds of silence before a member is Unreachable, from 0.2 to "
                             "3600 and longer than --heartbeat-interval (default 6)")
    parser.add_argument("--max-live-workloads", type=integer(1, 100000, "a number of workloads"),
                        default=MAX_LIVE_WORKLOADS,
                        help=f"workloads running at once, from 1 to 100000; SubmitWorkload "
                             f"refuses more (default {MAX_LIVE_WORKLOADS})")
    parser.add_argument("--unsafe-no-fsync", action="store_true",
                        help="do not fsync the state file (tests and benchmarks)")
    args = parser.parse_args(argv)
    tls_given = [args.tls_cert, args.tls_key, args.tls_ca]
    if args.insecure == any(tls_given) or (any(tls_given) and not all(tls_given)):
        parser.error("give --tls-cert, --tls-key and --tls-ca, or --insecure")
    if args.insecure and not on_loopback(args.listen):
        parser.error(f"--insecure with --listen {args.listen}: without TLS, anyone who can "
                     f"reach that address reads the fleet and member tokens off the wire; "
                     f"serve plaintext on loopback only (127.0.0.1, ::1 or localhost), or "
                     f"give --tls-cert, --tls-key and --tls-ca")
    if args.grace <= args.heartbeat_interval:
        parser.error(f"--grace ({args.grace:g}s) must be longer than --heartbeat-interval "
                     f"({args.heartbeat_interval:g}s), or every member looks silent")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = ServeSettings(
        hub=HubSettings(state_dir=args.state_dir.resolve(),
                        heartbeat_interval=args.heartbeat_interval, grace=args.grace,
                        fsync=not args.unsafe_no_fsync,
                        max_live_workloads=args.max_live_workloads),
        listen=args.listen,
        tls=None if args.insecure else Tls(cert=args.tls_cert, key=args.tls_key,
                                           ca=args.tls_ca))

    async def run() -> None:
        stop_flag = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop_flag.set)
        await serve(settings, stop_flag=stop_flag)

    setup.configure("fakefleet-hub")
    try:
        asyncio.run(run())
    except (OSError, TokenError) as error:  # a port taken, a full disk, a torn hub.key
        logging.getLogger(__name__).error("%s", error)
        return 1
    finally:
        setup.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
