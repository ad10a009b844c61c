"""The node's memory, as its cgroup counts it: did the kernel's out-of-memory killer end a process here?"""

import os

from tflab_guard import registry
from tflab_guard.protocol import LAPSED, STOPPED, Ending

# cgroup v2, then v1 (kernel 4.13 and later count oom_kill there too).
OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills():
    """How many processes the OOM killer has ended in this node's cgroup, or None where it is not counted."""
    for path in OOM_COUNTERS:
        try:
            with open(path) as handle:
                for line in handle:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


class OomWatch(object):
    """Counts the node's OOM kills from a program's start: its Ending says whether a SIGKILL was one."""

    def __init__(self, before=None):
        self.before = oom_kills() if before is None else before

    def killed(self):
        now = oom_kills()
        return self.before is not None and now is not None and now > self.before

    def ending(self, status, stopped_why=None):
        """The Ending of a wait status (negative: that signal), with why tflab stopped it, if it did."""
        return Ending.of_status(status, stopped_by_tflab=stopped_why == STOPPED, lapsed=stopped_why == LAPSED,
                                oom=status == -9 and self.killed())


def oom_sentence():
    return ("tflab: the kernel's out-of-memory killer ended this program: it outgrew the node's memory (%s)"
            % limit_text())


def ended(args):
    """Print KEY's Ending (JSON), or `unknown` (exit 1) while it runs or where nothing is recorded."""
    ending = registry.read_exit(args.key)
    if ending is None:
        print("unknown")
        return 1
    print(ending.to_json())
    return 0


def limit_text():
    """The node's memory limit as tflab set it, for messages."""
    mib = os.environ.get("TFLAB_MEMORY_MB")
    if not mib or not mib.isdigit():
        return "no limit set by tflab"
    mib = int(mib)
    return "%.1fG" % (mib / 1024.0) if mib >= 1024 else "%dM" % mib
