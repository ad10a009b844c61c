"""Is a server there yet: a port that accepts, or a process that still lives."""

import socket
import time

from tflab_guard import registry


def probe(args):
    """0 once HOST:PORT accepts (name resolution retried: a swarm service resolves once its task runs),
    3 when KEY's process ended first, 4 on timeout."""
    host, _, port = args.address.rpartition(":")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if args.key and registry.ended(args.key):
            return 3
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return 0
        except OSError:
            time.sleep(0.05)
    return 4


def alive(args):
    return 0 if registry.read_pid(args.key) is not None else 1
