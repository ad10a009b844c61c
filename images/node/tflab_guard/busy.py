"""Whether a process group is at work: the CPU time its processes use (from /proc).

What tells a slow start from a stuck one. A node held to a sliver of a CPU (a `fault cpu`) imports
TensorFlow for minutes, and its program's CPU time grows all along; a program blocked for good
uses none. So a probe waits past its
timeout for a server that is still busy starting (a cluster's workers wait for their parameter
servers as long as that takes), while one that used no CPU for a while is said to be stuck.
"""

import os
import time

from tflab_guard import registry


def group_ticks(pgid):
    """The CPU time (user and system, with that of their waited-for children) of the live processes of group
    `pgid`, and of process `pgid` itself, in clock ticks; None when there is none."""
    total, found = 0, False
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = registry.stat_fields(int(name))
        if not fields or len(fields) < 15 or fields[0] == "Z":
            continue
        if int(name) != pgid and fields[2] != str(pgid):
            continue
        try:
            total += sum(int(fields[i]) for i in (11, 12, 13, 14))
        except ValueError:
            continue
        found = True
    return total if found else None


class Progress(object):
    """Whether what is watched has used no CPU time for `stalled_s`: `stalled(who, ticks_of)`, where
    `ticks_of(who)` is its CPU ticks (None: nothing there, which uses none), read at most every `every_s`
    (a read scans /proc: a guard beside a program held to a sliver of a CPU must not take it). Another
    `who` (another process) starts the count again."""

    def __init__(self, stalled_s, every_s=0.5, clock=time.monotonic):
        self.stalled_s = stalled_s
        self.every_s = every_s
        self.clock = clock
        self.seen = None  # (who, its CPU ticks, when they last grew)
        self.first = None  # (who, its CPU ticks when first seen)
        self.read_at = None

    def stalled(self, who, ticks_of):
        now = self.clock()
        same = self.seen is not None and self.seen[0] == who
        if same and now - self.read_at < self.every_s:
            return now - self.seen[2] >= self.stalled_s
        ticks, self.read_at = ticks_of(who) or 0, now
        if self.first is None or self.first[0] != who:
            self.first = (who, ticks)
        if not same or ticks > self.seen[1]:
            self.seen = (who, ticks, now)
            return False
        return now - self.seen[2] >= self.stalled_s

    def used_s(self):
        """The CPU seconds used since it was first seen."""
        if self.seen is None or self.first is None or self.seen[0] != self.first[0]:
            return 0.0
        return (self.seen[1] - self.first[1]) / float(os.sysconf("SC_CLK_TCK"))
