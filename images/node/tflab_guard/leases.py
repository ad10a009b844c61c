"""Leases: tflab renews them while it is there; what they hold is stopped once they lapse.

A lease is renewed two ways. On the host, tflab sets the mtime of HOST_LEASES/LEASE (the lab's
runs folder, /runs in every node) every RENEW_EVERY_S, from a thread of its own: nothing of the
node takes part. And on each connection: a folder (/run/tflab/holds/LEASE) of holder files,
each renewed by a guard that reads a `renew` word from tflab's connection (the way a node on
another host, whose /runs tflab may not write, is renewed). A lease is held while either was
renewed in the last LEASE_S seconds. A connection that breaks does not end it: tflab attaches
again and renews on. A holder that says `stop` leaves (its file goes at once); one whose tflab
died (`kill -9`) lapses LEASE_S later.
"""

import os
import sys
import time

from tflab_guard import registry
from tflab_guard.protocol import HOLDING, HOST_LEASES, LEASE_S, RENEW, RENEW_EVERY_S, STOP

# A look at a lease this much later than the last one: this process was not running meanwhile (the
# cgroup freezer of a `pause` drill, `docker pause`, a suspended host), and neither was its reader.
FROZEN_S = 2.0
# A lease is looked at (its folder listed) at most this often: it lapses after LEASE_S, and a guard that
# looks ten times a second takes a share of a node held to a sliver of a CPU (a `fault cpu`).
LOOK_EVERY_S = 0.5


def folder(lease):
    return registry.state_path("holds", lease)


def holder_path(lease, holder):
    return os.path.join(folder(lease), holder)


def renew(lease, holder):
    """The holder renews the lease now."""
    path = holder_path(lease, holder)
    try:
        os.utime(path, None)
    except OSError:
        try:
            os.makedirs(folder(lease), exist_ok=True)
            with open(path, "a"):
                pass
        except OSError:
            pass


def leave(lease, holder):
    registry.unlink(holder_path(lease, holder))


def holders(lease, now=None):
    """The holders of `lease` renewed in the last LEASE_S seconds."""
    now = time.time() if now is None else now
    fresh = []
    try:
        names = os.listdir(folder(lease))
    except OSError:
        return fresh
    for name in names:
        try:
            if now - os.stat(holder_path(lease, name)).st_mtime <= LEASE_S:
                fresh.append(name)
        except OSError:
            continue
    return fresh


def host_renewed(lease, now=None):
    """Whether tflab renewed `lease` on the host in the last LEASE_S seconds (its file under HOST_LEASES)."""
    now = time.time() if now is None else now
    try:
        return now - os.stat(os.path.join(HOST_LEASES, lease)).st_mtime <= LEASE_S
    except OSError:
        return False


def held(lease):
    """Whether `lease` is held: renewed on the host, or by one of its holders."""
    return host_renewed(lease) or bool(holders(lease))


class Watch:
    """Whether a lease lapsed, as seen from a process that may itself have been frozen.

    A frozen node's guard reads nothing, so tflab's renewals queue on its connection while the
    holder files age. Thawed, a look at the lease could come before the reader has read them and
    stop a program for a lapse that never was. So a look that comes FROZEN_S or more after the one
    before it gives the reader a few renewals' time first: a freeze is not tflab's death.
    """

    def __init__(self, lease, clock=time.monotonic, fresh=None):
        self.lease = lease
        self.clock = clock
        self.fresh = fresh or held
        self.last = clock()
        self.after = self.last
        self.held_at = None  # when it was last seen held

    def lapsed(self):
        now = self.clock()
        if now - self.last >= FROZEN_S:
            self.after = now + 3 * RENEW_EVERY_S
        self.last = now
        if now < self.after:
            return False
        if self.held_at is not None and now - self.held_at < LOOK_EVERY_S:
            return False  # held when last looked at, a moment ago
        if self.fresh(self.lease):
            self.held_at = now
            return False
        return True


def hold(args):
    """Hold LEASE as HOLDER while tflab renews it; `holding` once held. `stop` leaves it; the connection's end
    does not (tflab attaches again), so an unrenewed holder lapses LEASE_S later."""
    renew(args.lease, args.holder)
    print(HOLDING, flush=True)
    try:
        for line in sys.stdin:
            word = line.strip()
            if word == RENEW:
                renew(args.lease, args.holder)
            elif word == STOP:
                leave(args.lease, args.holder)
                return 0
    except (OSError, ValueError):
        pass
    return 0


def has_holders(args):
    return 0 if holders(args.lease) else 1
