"""tflab's connection to a guard: its standard input, a word a line (protocol: go, stop, renew).

The connection is not a lifeline: its end (a `docker exec` stream the engine closed, an ssh
session that broke) stops nothing. What stops a process when tflab is gone is its lease
(leases.py), renewed by the `renew` words read here.
"""

import sys
import threading

from tflab_guard import leases
from tflab_guard.protocol import DELIVERED, DROP, GO, RENEW, STOP


class Connection(threading.Thread):
    """Reads tflab's words: `go` releases, `stop` asks to stop, `renew` renews (lease, holder), `delivered OUT ERR`
    answers the end lines (what tflab read), `drop`: tflab wants no more of the output (its reader is gone)."""

    def __init__(self, lease=None, holder=None):
        super().__init__(daemon=True, name="tflab-connection")
        self.lease = lease
        self.holder = holder
        self.released = threading.Event()
        self.stop_asked = threading.Event()
        self.closed = threading.Event()
        self.answered = threading.Event()  # a `delivered` came, or the connection ended
        self.delivered = None  # [OUT, ERR] of the `delivered` word
        self.dropped = threading.Event()
        if lease is not None:
            leases.renew(lease, holder)  # held from the start: the first renewal is a second away

    def run(self):
        try:
            for line in sys.stdin:
                word = line.strip()
                if word == RENEW and self.lease is not None:
                    leases.renew(self.lease, self.holder)
                elif word == GO:
                    self.released.set()
                elif word == DROP:
                    self.dropped.set()
                elif word == STOP:
                    self.stop_asked.set()
                    self.released.set()
                elif word.startswith(DELIVERED + " "):
                    try:
                        self.delivered = [int(n) for n in word.split()[1:3]]
                    except ValueError:
                        pass
                    self.answered.set()
        except (OSError, ValueError):
            pass
        finally:
            self.closed.set()
            self.answered.set()


def until_stop():
    """Return when tflab's connection says `stop` or ends (for what holds nothing: metrics)."""
    try:
        for line in sys.stdin:
            if line.strip() == STOP:
                return
    except (OSError, ValueError):
        pass
