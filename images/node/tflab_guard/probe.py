"""Is a server there yet: a port that accepts, a process that ended first, or one still busy starting."""

import socket
import time

from tflab_guard import busy, registry
from tflab_guard.protocol import PROBE_BUSY, PROBE_ENDED, PROBE_SERVING, PROBE_TIMEOUT, busy_reply


def probe(args):
    """PROBE_SERVING once HOST:PORT accepts (name resolution retried: a swarm service resolves once its task
    runs), PROBE_ENDED when KEY's process ended first (with --id, that start's: an earlier one's record stays
    until the new start's guard begins); at --timeout, PROBE_TIMEOUT, or with --quiet,
    PROBE_BUSY when KEY's processes used the CPU in the last --quiet
    seconds, printed as `busy SECONDS` (the CPU time they used in this probe). With --while-busy, the probe
    answers PROBE_TIMEOUT as soon as they used no CPU for --quiet seconds (stuck), and PROBE_BUSY at --timeout.
    It looks a few times a second: it runs in the server's node, whose CPU may be a sliver (a `fault cpu`)."""
    host, _, port = args.address.rpartition(":")
    began = time.monotonic()
    watched = None
    if args.quiet and args.key:
        watched = busy.Progress(args.quiet if args.while_busy else min(args.quiet, args.timeout), every_s=1.0)
    stalled, pause = False, 0.05
    while True:
        if args.key and registry.ended_start(args.key, args.id):
            return PROBE_ENDED
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return PROBE_SERVING
        except OSError:
            pass
        if watched is not None:
            stalled = watched.stalled(*_working(args.key))
            if stalled and args.while_busy:
                return PROBE_TIMEOUT
        if time.monotonic() - began >= args.timeout:
            if watched is None or stalled:
                return PROBE_TIMEOUT
            print(busy_reply(watched.used_s()))
            return PROBE_BUSY
        time.sleep(pause)
        pause = min(pause * 1.2, 0.1)  # a refused connect costs microseconds; a serving one is seen within 0.1 s


def _working(key):
    """(what to watch, how to read its CPU ticks): KEY's process group."""
    pgid = registry.read_pid(key)
    return pgid, busy.group_ticks if pgid is not None else (lambda _none: None)


def alive(args):
    return 0 if registry.read_pid(args.key) is not None else 1
