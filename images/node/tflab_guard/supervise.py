"""Processes tflab starts in a node: each the child of the guard that owns it, which learns its end by
waiting on it (`run`, attached to tflab; `serve`, shared by tflab's execs), `attach`, which picks a
process's output up again after a broken connection. Asked (`--end-in-stream`), both end
their two streams with the end line (protocol.StreamEnd): how the process ended, and what the
node kept of its output, which it forgets once tflab answers that it read all of it.

A program is started as on a cluster's machine: its command line, a new process in its own
process group, with nothing of tflab loaded in it; the guard is its parent and records its end
(protocol.Ending). The program's output goes to files in the node (registry.out_paths),
followed to tflab's connection from there: a connection that breaks, or ends before all of it
came through, loses nothing and stops nothing. What stops a process is tflab (`stop`), a signal
to its guard, or tflab's lease lapsing (tflab is gone).
"""

import os
import signal
import subprocess
import sys
import threading
import time

from tflab_guard import commands, groups, leases, memory, proctitle, registry, stopping
from tflab_guard.connection import Connection
from tflab_guard.protocol import (DELIVERED_WAIT_S, LAPSED, LEASE_S, LOST, OOM, REFUSED, STOP_GRACE_S, STOPPED, Ending,
                                  StreamEnd)

POLL_S = 0.1
HELD_POLL_S = 0.5  # a held program waits for `go` or `stop` (words that wake it at once), a signal, or a lapse
FOLLOW_IDLE_S = 0.25  # the longest a follower waits between two looks at an output file that does not grow
OWNER_GONE_S = 2.0  # a process gone with no guard and no record of its end for this long: its end is lost


class Follower(threading.Thread):
    """Copies a growing file to a stream from an offset; once `done` is set, to the file's end, then stops.
    A stream that breaks (tflab's connection) only ends the copy: the file keeps the rest. Once `dropped` is
    set (tflab's reader is gone: `yes | head -1`), it stops copying at once."""

    def __init__(self, path, stream, offset=0, dropped=None):
        super().__init__(daemon=True, name="follow")
        self.path = path
        self.stream = stream
        self.offset = offset
        self.done = threading.Event()
        self.dropped = dropped or threading.Event()
        self.lost = False

    def run(self):
        handle = None
        idle = 0.01
        try:
            while not self.dropped.is_set():
                finished = self.done.is_set()
                if handle is None:
                    try:
                        handle = open(self.path, "rb")
                        handle.seek(self.offset)
                    except OSError:
                        if finished:
                            return
                        time.sleep(0.05)
                        continue
                data = handle.read(65536)
                if data:
                    try:
                        self.stream.write(data)
                        self.stream.flush()
                    except (OSError, ValueError):
                        self.lost = True
                        return
                    self.offset += len(data)
                    idle = 0.01
                elif finished:
                    return
                else:
                    time.sleep(idle)
                    idle = min(idle * 2, FOLLOW_IDLE_S)
        finally:
            if handle is not None:
                handle.close()


def follow(key, out_offset=0, err_offset=0, dropped=None):
    out_path, err_path = registry.out_paths(key)
    followers = [Follower(out_path, sys.stdout.buffer, out_offset, dropped),
                 Follower(err_path, sys.stderr.buffer, err_offset, dropped)]
    for follower in followers:
        follower.start()
    return followers


def finish_following(followers):
    """Copy what is left. The kept output stays: only tflab knows whether all of it reached it (a write
    that succeeded here can still be lost on the way: an engine that closes the stream first), and
    the end line's answer forgets it once tflab says so (else `attach` reads the rest)."""
    for follower in followers:
        follower.done.set()
    for follower in followers:
        follower.join(10)


def say(sentence):
    try:
        sys.stderr.write(sentence + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class Stopper(object):
    """Stops the program's group once (SIGTERM, SIGKILL after the grace), having marked why."""

    def __init__(self, key, grace):
        self.key = key
        self.grace = grace
        self.why = None

    def __call__(self, pgid, why=STOPPED):
        if self.why is not None:
            return
        self.why = why
        registry.mark_stopped(self.key, why)
        if pgid is not None:
            threading.Thread(target=groups.stop_group, args=(pgid, self.grace), daemon=True).start()


def on_signals(handler):
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handler)


class Program(object):
    """The program of a command line, the guard's own child once started: a new session (its own process group),
    its command line as it is, the guard's environment with the line's own settings."""

    def __init__(self, plan, env, out, err):
        self.plan, self.env, self.out, self.err = plan, env, out, err
        self.child = None

    def start(self):
        self.child = subprocess.Popen(self.plan.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=self.out,
                                      stderr=self.err, start_new_session=True)
        return self.child.pid

    def pgid(self):
        return None if self.child is None else self.child.pid

    def running(self):
        return self.child is not None and self.child.poll() is None

    def status(self):
        code = self.child.wait()
        if self.plan.kind == "shell" and 128 < code < 128 + 65:
            return -(code - 128)  # sh reports its command's signal so: the signal it was
        return code


def refuse(key, refusal, write):
    code, sentence = refusal
    write(sentence)
    registry.write_exit(key, Ending(code, None, REFUSED))
    return code


def _open_outputs(key):
    paths = registry.out_paths(key)
    os.makedirs(os.path.dirname(paths[0]), exist_ok=True)
    return [open(path, "wb", buffering=0) for path in paths]


def own_title(verb, key):
    """The guard's own title: its key, not its program's command line, which is the program's alone (a user's
    `pkill -f train.py` reaches the program, as on a cluster's machine, and not the guard that records its end)."""
    proctitle.set_title("tflab-guard %s %s" % (verb, key), "tflab-guard")


def run(args):
    key = args.key
    own_title("run", key)
    if registry.read_pid(key) is not None or registry.read_guard(key) is not None:
        # an earlier process of this key still there (its tflab gone, its lease not yet lapsed): it goes first
        stopping.stop_keys([key], 0, force=True)
    registry.begin(key, args.id)
    plan = commands.plan_command(args.shell, args.argv)
    env = plan.environment(os.environ)
    lease = args.lease or key
    connection = Connection(lease, key)
    connection.start()
    out, err = _open_outputs(key)
    followers = follow(key, dropped=connection.dropped)
    refusal = commands.missing(plan, env)
    if refusal is not None:  # said in its output, as a shell says `command not found`
        code = refuse(key, refusal, lambda sentence: err.write((sentence + "\n").encode()))
        _end_output(args, key, registry.read_exit(key), (out, err), followers, connection)
        registry.unlink(registry.guard_path(key))
        return code
    oom = memory.OomWatch()
    stopper = Stopper(key, args.grace)
    signalled = []
    on_signals(lambda _signum, _frame: signalled.append(True))
    watch = leases.Watch(lease)

    def told_to_stop():
        return bool(signalled) or connection.stop_asked.is_set() or watch.lapsed()

    program = Program(plan, env, out, err)
    # Held until `go`; told to stop first, it never starts. A `stop` wakes a held wait as `go` does (it sets
    # both): what releases a program is a `go` with no stop.
    if args.wait_for_go:
        while not connection.released.is_set() and not told_to_stop():
            connection.released.wait(HELD_POLL_S)
    if told_to_stop():
        stopper(None, STOPPED if signalled or connection.stop_asked.is_set() else LAPSED)
    if stopper.why is not None:  # stopped while held: it never ran
        ending = Ending.never_ran(stopper.why)  # recorded as that: no signal reached a program
    else:
        registry.write_pid(key, program.start())
        while program.running():
            if signalled or connection.stop_asked.is_set():
                stopper(program.pgid())
            elif watch.lapsed():
                stopper(program.pgid(), LAPSED)
            time.sleep(POLL_S)
        ending = oom.ending(program.status(), registry.stopped_why(key))
    registry.write_exit(key, ending)
    if ending.reason == OOM:
        err.write((memory.oom_sentence() + "\n").encode())
    _end_output(args, key, ending, (out, err), followers, connection)
    leases.leave(lease, key)
    registry.unlink(registry.guard_path(key))
    return ending.status()


def _end_output(args, key, ending, handles, followers, connection):
    """The program's output closed and followed to its end; then, where tflab asked, the end lines."""
    for handle in handles:
        handle.close()
    finish_following(followers)
    if args.end_in_stream:
        tell_end(key, ending, connection)


def tell_end(key, ending, connection):
    """The end line on stdout and on stderr (after all of the output: protocol.StreamEnd); once tflab answers that
    it read all the node kept of both, or said it wants no more (`drop`), the kept output is forgotten (else
    `attach` reads it again). How it ended stays until the key's next start: a probe of this start may still
    look for it (a server that ended before serving), and one of the next start counts only its own (--id)."""
    paths = registry.out_paths(key)
    kept = [_size(path) for path in paths]
    line = StreamEnd(ending, kept).line()
    for stream in (sys.stdout.buffer, sys.stderr.buffer):
        try:
            stream.write(line)
            stream.flush()
        except (OSError, ValueError):
            return  # the connection is gone: an `attach` tells it again
    if connection.dropped.is_set() or (connection.answered.wait(DELIVERED_WAIT_S) and connection.delivered == kept):
        for path in paths:
            registry.unlink(path)


def serve(args):
    """A server shared by tflab's execs: lives while its lease is held (without one, until `stop`)."""
    key = args.key
    own_title("serve", key)
    registry.begin(key)
    plan = commands.plan_command(args.shell, args.argv)
    env = plan.environment(os.environ)
    if args.log:
        os.makedirs(os.path.dirname(args.log) or ".", exist_ok=True)
    log = open(args.log, "ab", buffering=0) if args.log else open(os.devnull, "wb")
    refusal = commands.missing(plan, env)
    if refusal is not None:
        code = refuse(key, refusal, lambda sentence: log.write((sentence + "\n").encode()))
        registry.unlink(registry.guard_path(key))
        return code
    oom = memory.OomWatch()
    stopper = Stopper(key, args.grace)
    signalled = []
    on_signals(lambda _signum, _frame: signalled.append(True))
    started = time.monotonic()
    watch = leases.Watch(args.lease) if args.lease is not None else None

    def lease_lapsed():
        return watch is not None and watch.lapsed() and time.monotonic() - started > LEASE_S

    program = Program(plan, env, log, log)
    registry.write_pid(key, program.start())
    while program.running():
        if signalled:
            stopper(program.pgid())
        elif lease_lapsed():
            stopper(program.pgid(), LAPSED)
        time.sleep(POLL_S)
    ending = oom.ending(program.status(), registry.stopped_why(key))
    registry.write_exit(key, ending)
    if ending.reason == OOM:
        log.write((memory.oom_sentence() + "\n").encode())
    registry.unlink(registry.guard_path(key))
    return ending.status()


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def attach(args):
    """KEY's output again from the offsets tflab had, and its end (as its exit code): what tflab runs when its
    connection to KEY's guard broke. Renews the lease and passes `stop` on, as that guard did. Where nobody owns
    the process any more (its guard was killed with it: a node's every process killed, a container restarted),
    its end is lost, said at once: with --end-in-stream, in the end line after what the node kept of its output."""
    key = args.key
    lease = args.lease or key
    connection = Connection(lease, key)
    connection.start()
    nobody = registry.read_exit(key) is None and registry.read_guard(key) is None and registry.read_pid(key) is None
    if nobody and not args.end_in_stream:
        say("tflab: no process %s in this node" % key)
        return 255
    followers = follow(key, args.out, args.err, connection.dropped)
    stopper = Stopper(key, STOP_GRACE_S)
    lost_since = None
    ending = Ending(255, None, LOST) if nobody else None
    while ending is None:
        ending = registry.read_exit(key)
        if ending is not None:
            break
        if connection.stop_asked.is_set():
            stopper(registry.read_pid(key))
        if registry.read_guard(key) is None and registry.read_pid(key) is None:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > OWNER_GONE_S:
                ending = Ending(255, None, LOST)
                break
        time.sleep(POLL_S)
    finish_following(followers)
    if args.end_in_stream:
        tell_end(key, ending, connection)
    return ending.status()

