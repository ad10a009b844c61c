"""Leases: the `tflab exec`s of a task hold its shared servers; a server lives while a holder does."""

import glob
import os
import sys

from tflab_guard import registry


def folder(lease):
    return registry.state_path("holds", lease)


def holders(lease):
    """The pid files of the live holders of `lease`."""
    return [p for p in glob.glob(os.path.join(folder(lease), "*.pid")) if registry.read_pid(p) is not None]


def hold(args):
    """Hold the lease until tflab's connection ends (or says stop); `holding` once it is held."""
    os.makedirs(folder(args.lease), exist_ok=True)
    path = os.path.join(folder(args.lease), "%d.pid" % os.getpid())
    with open(path, "w") as handle:
        handle.write("%d %s\n" % (os.getpid(), registry.start_time(os.getpid())))
    print("holding", flush=True)
    try:
        until_stop()
    finally:
        registry.unlink(path)
    return 0


def until_stop():
    """Return when tflab's connection (this process's stdin) says `stop` or ends."""
    try:
        for line in sys.stdin:
            if line.strip() == "stop":
                return
    except (OSError, ValueError):
        pass


def held(args):
    return 0 if holders(args.lease) else 1
