"""The node's memory, as its cgroup counts it: did the kernel's out-of-memory killer end a process here?"""

import os
import sys

from tflab_guard import registry

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
    """Counts the node's OOM kills from a program's start: `killed(code)` says whether its end was one.

    The count at the start is kept beside KEY's pid file too, so that the end of a program that
    took its guard with it (one run in the guard's own interpreter) can still be told (`ended`).
    """

    def __init__(self, key):
        self.key = key
        self.before = oom_kills()
        if self.before is not None:
            try:
                os.makedirs(registry.STATE, exist_ok=True)
                with open(registry.state_path(key + ".oom"), "w") as handle:
                    handle.write("%d\n" % self.before)
            except OSError:
                pass

    def killed(self, code):
        if code not in (137, -9) or self.before is None:
            return False
        now = oom_kills()
        return now is not None and now > self.before

    def finish(self, code, stream=None):
        """Record KEY's end (`oom` where the OOM killer ended it, said on `stream` too); the exit code."""
        oom = self.killed(code)
        if oom:
            sentence = ("tflab: the kernel's out-of-memory killer ended this program: it outgrew the node's "
                        "memory (%s)" % limit_text())
            try:
                print(sentence, file=stream or sys.stderr, flush=True)
            except TypeError:  # a log file opened for bytes
                stream.write((sentence + "\n").encode())
            except (OSError, ValueError):
                pass
        registry.write_exit(self.key, 137 if oom else code, "oom" if oom else None)
        registry.unlink(registry.state_path(self.key + ".oom"))
        return code


def ended(args):
    """Print KEY's end: `CODE [oom]`, or `CODE oom` for a program that took its guard with it, else `unknown`."""
    status = registry.read_exit(args.key)
    if status is not None:
        print("%d%s" % (status[0], " " + status[1] if status[1] else ""))
        return 0
    try:
        with open(registry.state_path(args.key + ".oom")) as handle:
            before = int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        before = None
    now = oom_kills()
    if before is not None and now is not None and now > before and registry.read_pid(args.key) is None:
        print("137 oom")
        return 0
    print("unknown")
    return 1


def limit_text():
    """The node's memory limit as tflab set it, for messages."""
    mib = os.environ.get("TFLAB_MEMORY_MB")
    if not mib or not mib.isdigit():
        return "no limit set by tflab"
    mib = int(mib)
    return "%.1fG" % (mib / 1024.0) if mib >= 1024 else "%dM" % mib
