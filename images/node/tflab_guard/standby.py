"""The warm standby: one interpreter per node with TensorFlow imported, of which each program is a copy.

A `run --warm` (or `serve --warm`) claims it over a unix socket, then hands it the program:
argv, environment, folder, and its own standard input, output and error, passed as file
descriptors (sendmsg with SCM_RIGHTS: socket.send_fds is Python 3.9+). The standby forks
for each claim: that child owns the claim, and forks the program, whose parent it stays: it
waits on it and records how it ended, exactly as a guard records a cold program's end
(protocol.Ending). The program is the interpreter copied, TensorFlow imported (memory shared
until it writes it), with the program's command line as its process title. The standby
itself stays, ready for the next program at once (two at a time alike), and leaves after a
while unclaimed. Only one is ever made at a time (a lock held while it lives), and claims
are taken one by one (a lock around a claim).
"""

import array
import gc
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

from tflab_guard import busy, commands, groups, memory, proctitle, registry
from tflab_guard.protocol import (GUARD, GUARD_PATH, STANDBY_TAKEN, WARM_MAKING, WARM_NONE, WARM_READY,
                                  Handover)

KEY = "standby"
HEADER = struct.Struct("!I")


def socket_path():
    return registry.state_path("standby.sock")


def ready():
    """Whether this node's standby is imported and listening."""
    return registry.read_pid(KEY) is not None and os.path.exists(socket_path())


def warm_state(_args=None):
    """`warm`'s exit code: WARM_READY, WARM_MAKING (importing), or WARM_NONE."""
    if ready():
        return WARM_READY
    return WARM_MAKING if registry.read_pid(KEY) is not None else WARM_NONE


def send_fds(sock, payload, fds):
    """`payload` and the descriptors `fds` over a unix socket (the descriptors ride on the header)."""
    sock.sendmsg([HEADER.pack(len(payload))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    sock.sendall(payload)


def _read_exactly(sock, size):
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the peer went away")
        data += chunk
    return data


def recv_fds(sock, max_fds):
    """(payload, descriptors) sent by `send_fds`."""
    fds = array.array("i")
    header, ancillary, _flags, _address = sock.recvmsg(HEADER.size, socket.CMSG_LEN(max_fds * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if len(header) < HEADER.size:
        header += _read_exactly(sock, HEADER.size - len(header))
    (size,) = HEADER.unpack(header)
    return _read_exactly(sock, size), list(fds)


def ensure():
    """A standby made where this node has none (it left unclaimed, the OOM killer took it): what a `--warm` run's
    guard does as it ends, so the next program finds one. Detached, with the node's own environment (its first
    process's), not the run's."""
    if warm_state() != WARM_NONE:
        return
    env = dict(os.environ)
    argv = [sys.executable, sys.argv[0], "standby"]  # (the guard's own tests: their interpreter, their environment)
    if os.path.abspath(sys.argv[0]) == GUARD_PATH:  # in a node: as tflab starts one (what `ps` shows), as the node has it
        argv = GUARD + ["standby"]
        try:
            with open("/proc/1/environ", "rb") as handle:
                env = dict(item.decode(errors="replace").split("=", 1)
                           for item in handle.read().split(b"\0") if b"=" in item)
        except (OSError, ValueError):
            pass
        env.setdefault("PATH", os.environ.get("PATH", os.defpath))
    try:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=env, cwd="/")
    except OSError:
        pass


def standby(args):
    """Make the standby: a child that imports TensorFlow once and, for each program handed to it, forks (the
    program a copy of an interpreter that has imported it); this process, its parent, waits until it leaves."""
    lock = registry.try_lock("standby")
    if lock is None:
        return 0  # this node has one already, or one is being made
    pid = os.fork()
    if pid == 0:
        try:
            code = interpreter(args, lock)
        except SystemExit as leaving:  # a program it forked has ended: that process exits as it asked
            raise leaving
        except BaseException:  # noqa: BLE001 - never back into the parent's code
            code = 1
        os._exit(code)
    lock.close()  # the child holds the lock (the same open file) while it lives
    proctitle.set_title("tflab-guard standby owner", "tflab-owner")
    os.waitpid(pid, 0)
    return 0


# The standby's memory is not the program's: where the node runs out, the kernel ends it first (its
# programs are set back to the node's own score), so a program has the memory it would have on a machine
# of the node's size without it.
OOM_SCORE = "/proc/self/oom_score_adj"


def interpreter(args, lock):
    """The standby itself: TensorFlow imported, waiting on the socket; in a claim's forked child, that claim's
    owner, and below it the program (which exits as the program ends)."""
    try:
        os.setsid()
    except OSError:
        pass
    # A socket left by a standby that was killed (the OOM killer takes it first) would say this one ready while
    # it still imports: the lock held, no live standby has it.
    registry.unlink(socket_path())
    registry.write_pid(KEY, os.getpgrp())
    try:
        import tensorflow  # noqa: F401  (the point: paid before anyone waits for it)
    except Exception:  # noqa: BLE001 - no TensorFlow: no standby
        registry.unlink(registry.pid_path(KEY))
        return 1
    if hasattr(gc, "freeze"):  # Python 3.7+: a program's collections leave the shared pages alone
        gc.freeze()
    own_score = _oom_score(1000)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # each claim's owner is reaped as it ends
    path = socket_path()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    registry.unlink(path)
    server.bind(path)
    server.listen(8)
    server.settimeout(args.idle)
    standby_pid = os.getpid()
    try:
        connection = _accept_claims(server)
    finally:
        if os.getpid() == standby_pid:  # the standby leaves (unused for a while); a claim's child goes on
            server.close()
            registry.unlink(path)
            registry.unlink(registry.pid_path(KEY))
            lock.close()  # the next standby may be made
    if connection is None:
        return 0
    server.close()
    lock.close()  # the standby's, not this child's
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _oom_score(own_score)
    return own_claim(connection)


def _accept_claims(server):
    """Accept claims until none came for the idle time (None); in each claim's forked child, its connection."""
    while True:
        try:
            connection, _ = server.accept()
        except socket.timeout:
            return None
        if os.fork() == 0:
            return connection
        connection.close()


def _oom_score(score):
    """Set this process's OOM score adjustment (best effort); the one it had."""
    try:
        with open(OOM_SCORE) as handle:
            was = handle.read().strip()
        with open(OOM_SCORE, "w") as handle:
            handle.write(str(score))
        return was
    except (OSError, ValueError):
        return str(score)


def own_claim(connection):
    """In a claim's child: take the program, fork it, wait on it and record its end (this child is its owner)."""
    connection.settimeout(None)
    try:
        connection.sendall(STANDBY_TAKEN)
        message, fds = recv_fds(connection, 3)
    except (OSError, EOFError):
        return 1  # the claimant went away before handing a program over
    request = Handover.parse(message)
    if len(fds) != 3 or request is None:
        return 1
    key = request.key
    oom = memory.OomWatch()
    pid = os.fork()
    if pid == 0:
        os.setsid()  # the program's own group, which a stop signals
        become(request, fds, connection)  # exits as the program ends
    for fd in fds:
        os.close(fd)
    connection.close()
    proctitle.set_title("tflab-guard warm owner", "tflab-owner")
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    registry.write_exit(key, oom.ending(code, registry.stopped_why(key)))
    return 0


def become(request, fds, connection):
    """Turn this interpreter into the program of `request`, on the descriptors `fds`; exits with its code."""
    connection.sendall(Handover.started(os.getpid()))
    _reseed()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    argv = request.argv
    proctitle.set_title(commands.command_line(argv), os.path.basename(argv[0]))

    def watch_claimant():
        # The guard that handed the program over owns its lease: if that guard is gone, so is the program.
        try:
            while connection.recv(1):
                pass
        except OSError:
            pass
        groups.stop_group(os.getpgrp(), request.grace)

    threading.Thread(target=watch_claimant, daemon=True).start()
    sys.exit(commands.run_program(argv))


def _reseed():
    """A forked program draws its own random numbers, as a program started anew would: the generators seeded at
    import (Python's; NumPy's global one, which TensorFlow imports) are seeded again from the system."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:  # noqa: BLE001 - a NumPy without the legacy global generator
            pass


# A standby whose import has not used the CPU for this long is stalled: the program starts on its own instead.
STALLED_S = 15.0


def claim(given_up=lambda: False, stalled_s=STALLED_S):
    """This node's standby, claimed (a connection to it); None when there is none, or `given_up()` says to stop.

    One still importing TensorFlow is waited for as long as its import goes on (its CPU time grows): a
    program started on its own would import TensorFlow from the start, on the same CPUs, so it is never the
    quicker, least of all in a node held to a sliver of a CPU (a `fault cpu`), where an import takes a minute
    and two at once take twice that. One whose import has used no CPU for `stalled_s` is passed over.
    """
    progress = busy.Progress(stalled_s)
    pause = 0.05
    while not given_up():
        with registry.locked("claim"):
            if os.path.exists(socket_path()):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(10)
                    sock.connect(socket_path())
                    if _read_exactly(sock, len(STANDBY_TAKEN)) == STANDBY_TAKEN:
                        sock.settimeout(None)
                        return sock
                except (OSError, EOFError):
                    pass
                sock.close()
        pid = registry.read_pid(KEY)
        if pid is None or progress.stalled(pid, busy.group_ticks):
            return None  # none importing, or one that no longer moves
        time.sleep(pause)
        pause = min(pause * 1.5, 0.5)  # looking costs a node held to a sliver of a CPU what its import needs
    return None


def hand_over(key, argv, env, sock, stdout, stderr, grace):
    """Hand `argv` to the claimed standby, on the descriptors given; its pid (its owner records its end)."""
    with open(os.devnull, "rb") as devnull:
        send_fds(sock, Handover(key, argv, env, os.getcwd(), grace).message(), [devnull.fileno(), stdout, stderr])
    return Handover.read_started(sock.makefile("r").readline())  # None: it died as it took the program
