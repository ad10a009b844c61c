"""The registry: which process group tflab started under which key, which guard owns it, and how it ended.

Files live in the state folder (/run/tflab): KEY.pid holds `PGID STARTTIME` of the program
(the start time tells a live process from a recycled pid), KEY.guard the same of the guard
that owns it, KEY.exit its Ending (protocol.Ending, JSON) once it ended, KEY.stop that
tflab stopped it, out/KEY.out and out/KEY.err its output (kept in the node until tflab says it
read all of it, so that a broken or cut-short connection loses none of it). A stop finds
processes here, never by a pattern over /proc: a guard signals only what it, or another guard
of this node, started and recorded.
Changes that read and then write are made under one lock (registry.lock).
"""

import contextlib
import fcntl
import fnmatch
import glob
import os
import time

from tflab_guard.protocol import STOPPED, Ending

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


def stat_fields(pid):
    """The fields of /proc/PID/stat after the process's name (the state first), or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid):
    """The kernel's start time of `pid`, or None when there is no such process."""
    fields = stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def _write_atomically(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def begin(key, start_id=None):
    """A new process of KEY is started by this guard: the last one's records go, this guard is recorded (with
    the start's own word, where tflab gave one: a probe that has it counts no earlier ending)."""
    forget(key)
    if start_id is not None:
        _write_atomically(id_path(key), start_id + "\n")
    _write_atomically(guard_path(key), "%d %s\n" % (os.getpid(), start_time(os.getpid())))


def forget(key):
    """KEY's records of how it ended and what it printed gone: a new start of KEY begins, or a stop forgets them."""
    for path in (exit_path(key), stop_path(key), id_path(key)) + out_paths(key):
        unlink(path)


def id_path(key):
    return state_path(key + ".id")


def ended_start(key, start_id):
    """Whether KEY's process has ended: with `start_id`, only that start's ending counts (until the new start
    begins, the last one's record is still there)."""
    if not ended(key):
        return False
    if start_id is None:
        return True
    try:
        with open(id_path(key)) as handle:
            return handle.read().strip() == start_id
    except OSError:
        return False


def write_pid(key, pgid):
    _write_atomically(pid_path(key), "%d %s\n" % (pgid, start_time(pgid)))


def guard_path(key):
    return state_path(key + ".guard")


def stop_path(key):
    return state_path(key + ".stop")


def out_paths(key):
    """Where KEY's standard output and error are kept in the node."""
    return (state_path("out", key + ".out"), state_path("out", key + ".err"))


def mark_stopped(key, why=STOPPED):
    """tflab stops KEY's process now (`why`: stopped, or lease when tflab's lease lapsed)."""
    try:
        _write_atomically(stop_path(key), why + "\n")
    except OSError:
        pass


def stopped_why(key):
    """`stopped` or `lease` when tflab stopped KEY's process, else None."""
    try:
        with open(stop_path(key)) as handle:
            return handle.read().strip() or STOPPED
    except OSError:
        return None


def write_exit(key, ending):
    """KEY's process ended so (an Ending); it is no longer a live process of the registry."""
    try:
        _write_atomically(exit_path(key), ending.to_json() + "\n")
    except OSError:
        pass
    unlink(pid_path(key))


def read_exit(key):
    """KEY's Ending once it ended, else None."""
    try:
        with open(exit_path(key)) as handle:
            return Ending.from_json(handle.read())
    except OSError:
        return None


def read_guard(key):
    """The pid of the live guard that owns KEY's process, or None."""
    return _live(guard_path(key))


def guard_identity(key):
    """KEY's live guard as (pid, start time), or None. A guard removes its record a moment before it has
    exited: whoever must see it gone waits on this, not on the record."""
    pid = read_guard(key)
    return None if pid is None else (pid, start_time(pid))


def lives(identity):
    """Whether the process `identity` (pid, start time) names still runs (a zombie has ended; a recycled
    pid is another process)."""
    pid, started = identity
    return start_time(pid) == started and not zombie(pid)


def _live(path):
    """The pid a `PID STARTTIME` record names while that very process lives (not a recycled pid, not a zombie)."""
    pid = _record(path)[0]
    return None if pid is None or zombie(pid) else pid


def _record(path):
    """(the pid of a `PID STARTTIME` record while that very process exists, else None; the file read, by its
    inode, or None where there was no file)."""
    try:
        with open(path) as handle:
            inode = os.fstat(handle.fileno()).st_ino
            fields = handle.read().split()
    except OSError:
        return None, None
    try:
        pid, started = int(fields[0]), fields[1] if len(fields) > 1 else None
    except (ValueError, IndexError):
        return None, inode
    now = start_time(pid)
    if now is None or (started not in (None, "None") and now != started):
        return None, inode
    return pid, inode


def zombie(pid):
    fields = stat_fields(pid)
    return bool(fields) and fields[0] == "Z"


def wait_gone(pid_of, timeout):
    """Wait until `pid_of()` is None (its process is gone); whether it is."""
    deadline = time.monotonic() + timeout
    while pid_of() is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def read_pid(key_or_path):
    """The live process group of a pid file, or None. A stale file is removed: the very file read, never one
    written since. (A reader that found no file and then removed the one a starting process had just
    written left a program that a stop could not find.)"""
    path = key_or_path if key_or_path.endswith(".pid") else pid_path(key_or_path)
    pgid, inode = _record(path)
    if pgid is None and inode is not None:
        try:  # a record written since replaced the file (a new inode): it stays
            if os.stat(path).st_ino == inode:
                os.unlink(path)
        except OSError:
            pass
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
