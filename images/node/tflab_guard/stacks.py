"""Where a process waits: the Python stack of every thread of KEY's processes, as py-spy dumps it.

A cluster's expert reads the stack before naming a cause. `stack KEY` runs `py-spy dump` on each live
Python process of KEY's process group (the program; a shell line's Python children), and prints what it
printed, one dump after another. py-spy is a static binary tflab ships into the node image (PY_SPY); it
reads another process's memory, which a container allows with the SYS_PTRACE capability (tflab's nodes
get it). Exit codes (protocol.STACK_*): 0 dumped, 3 no live process of KEY, 4 py-spy missing or refused
(its own words on stderr).
"""

import os
import shutil
import subprocess
import sys

from tflab_guard import registry
from tflab_guard.protocol import STACK_CANNOT as CANNOT
from tflab_guard.protocol import STACK_NOTHING as NOTHING

PY_SPY = "/usr/local/share/tflab/py-spy"
DUMP_TIMEOUT_S = 20.0


def py_spy():
    """The py-spy to run: the one tflab ships, else one on PATH; None without."""
    if os.access(PY_SPY, os.X_OK):
        return PY_SPY
    return shutil.which("py-spy")


def members(pgid):
    """The live processes of group `pgid` (the leader first)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = registry.stat_fields(int(name))
        if fields and len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            found.append(int(name))
    return sorted(found, key=lambda pid: (pid != pgid, pid))


def is_python(pid):
    try:
        return os.path.basename(os.readlink("/proc/%d/exe" % pid)).startswith("python")
    except OSError:
        return False


def command_line(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"


def stack(args):
    pgid = registry.read_pid(args.key)
    live = members(pgid) if pgid is not None else []
    if not live:
        return NOTHING
    pids = [pid for pid in live if is_python(pid)]
    if not pids:
        sys.stderr.write("tflab: no Python process to read: it runs %s\n" % "; ".join(command_line(pid) for pid in live))
        return CANNOT
    tool = py_spy()
    if tool is None:
        sys.stderr.write("tflab: py-spy is not in this node (an image made by an older tflab: `tflab up` builds it)\n")
        return CANNOT
    dumped = False
    for pid in pids:
        try:
            done = subprocess.run([tool, "dump", "--full-filenames", "--pid", str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=DUMP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            sys.stderr.write("tflab: py-spy dump of %d: %s\n" % (pid, exc))
            continue
        if done.returncode == 0 and done.stdout:
            sys.stdout.write(done.stdout.decode("utf-8", "replace"))
            sys.stdout.flush()
            dumped = True
        else:
            sys.stderr.write(done.stderr.decode("utf-8", "replace"))
    return 0 if dumped else CANNOT
