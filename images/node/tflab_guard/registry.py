"""The pid registry: which process group tflab started under which key, and how it ended.

Files live in the state folder (/run/tflab): KEY.pid holds `PGID STARTTIME` (the start
time tells a live process from a recycled pid), KEY.exit the exit code once it ended.
Changes that read and then write are made under one lock (registry.lock).
"""

import contextlib
import fcntl
import fnmatch
import glob
import os

STATE = os.environ.get("TFLAB_GUARD_STATE", "/run/tflab")  # tests point it elsewhere


def state_path(*parts):
    return os.path.join(STATE, *parts)


def pid_path(key):
    return state_path(key + ".pid")


def exit_path(key):
    return state_path(key + ".exit")


def unlink(path):
    """Remove `path`; gone already (another guard was quicker) is fine."""
    try:
        os.unlink(path)
    except OSError:
        pass


@contextlib.contextmanager
def locked(name="registry"):
    """An exclusive lock between the guards of this node (released when its holder dies)."""
    os.makedirs(STATE, exist_ok=True)
    with open(state_path(name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def try_lock(name):
    """An exclusive lock held as long as the returned file stays open; None when another holds it."""
    os.makedirs(STATE, exist_ok=True)
    handle = open(state_path(name + ".lock"), "a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def start_time(pid):
    """The kernel's start time of `pid`, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def write_pid(key, pgid):
    os.makedirs(STATE, exist_ok=True)
    unlink(exit_path(key))
    tmp = "%s.%d.tmp" % (pid_path(key), os.getpid())
    with open(tmp, "w") as handle:
        handle.write("%d %s\n" % (pgid, start_time(pgid)))
    os.replace(tmp, pid_path(key))


def write_exit(key, code, note=None):
    """KEY's process ended with `code`; `note` says how where the guard knows (`oom`)."""
    try:
        os.makedirs(STATE, exist_ok=True)
        with open(exit_path(key), "w") as handle:
            handle.write("%d%s\n" % (code, " " + note if note else ""))
    except OSError:
        pass
    unlink(pid_path(key))


def read_exit(key):
    """(exit code, note) of KEY's process once it ended, else None."""
    try:
        with open(exit_path(key)) as handle:
            fields = handle.read().split()
        return int(fields[0]), (fields[1] if len(fields) > 1 else None)
    except (OSError, ValueError, IndexError):
        return None


def read_pid(key_or_path):
    """The live process group of a pid file, or None (a stale file is removed)."""
    path = key_or_path if key_or_path.endswith(".pid") else pid_path(key_or_path)
    try:
        with open(path) as handle:
            fields = handle.read().split()
        pgid, started = int(fields[0]), fields[1] if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    now = start_time(pgid)
    if now is None or (started not in (None, "None") and now != started):
        unlink(path)
        return None
    return pgid


def ended(key):
    """Whether KEY's process has ended (its exit code is written)."""
    return os.path.exists(exit_path(key))


def matching(patterns, suffix=".pid"):
    """(key, path) of the registry's files whose key matches one of `patterns`."""
    found = []
    for path in glob.glob(state_path("*" + suffix)):
        key = os.path.basename(path)[:-len(suffix)]
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns):
            found.append((key, path))
    return found
