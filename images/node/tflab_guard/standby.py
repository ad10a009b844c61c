"""The warm standby: one interpreter per node with TensorFlow imported, waiting to become the next program.

Its owner (the process that made it) is its parent: it waits on it and records how the program it
became ended, exactly as a guard records a cold program's end (protocol.Ending).
A `run --warm` (or `serve --warm`) claims it over a unix socket, then hands it the program:
argv, environment, folder, and its own standard input, output and error, passed as file
descriptors (sendmsg with SCM_RIGHTS: socket.send_fds is Python 3.9+). The standby becomes
the program, with the program's command line as its process title. It is made again after
each run (tflab asks) and leaves after a while unused. Only one is ever made at a time
(a lock held while it waits), and only one guard claims it (a lock around the claim).
"""

import array
import json
import os
import socket
import struct
import sys
import threading
import time

from tflab_guard import busy, commands, groups, memory, proctitle, registry

KEY = "standby"
HEADER = struct.Struct("!I")
TAKEN = b"taken\n"


def socket_path():
    return registry.state_path("standby.sock")


def ready():
    """Whether this node's standby is imported and listening."""
    return registry.read_pid(KEY) is not None and os.path.exists(socket_path())


def warm_state(_args=None):
    """`warm`'s exit code: 0 the standby is ready, 1 it is being made (importing), 2 there is none."""
    if ready():
        return 0
    return 1 if registry.read_pid(KEY) is not None else 2


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


def standby(args):
    """Make the standby: a child that imports TensorFlow and waits to become a program, and this process, its
    owner, which waits on it and records how the program it became ended (the same Ending as a cold one's)."""
    lock = registry.try_lock("standby")
    if lock is None:
        return 0  # this node has one already, or one is being made
    said, told = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(said)
        try:
            code = interpreter(args, lock, told)
        except SystemExit as leaving:  # the program it became has ended: exit as it asked
            raise leaving
        except BaseException:  # noqa: BLE001 - never back into the owner's code
            code = 1
        os._exit(code)
    os.close(told)
    lock.close()  # the child holds the lock (the same open file) while it waits
    proctitle.set_title("tflab-guard standby owner", "tflab-owner")
    _, status = os.waitpid(pid, 0)
    os.set_blocking(said, False)
    try:
        words = os.read(said, 4096).decode().split()
    except OSError:
        words = []
    if len(words) < 2:
        return 0  # it became no program (left unused, or its claimant went away)
    key, before = words[0], None if words[1] == "-" else int(words[1])
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    registry.write_exit(key, memory.OomWatch(before).ending(code, registry.stopped_why(key)))
    return 0


def interpreter(args, lock, told):
    """The standby itself: TensorFlow imported, waiting on the socket; the program once claimed (no return)."""
    try:
        os.setsid()
    except OSError:
        pass
    registry.write_pid(KEY, os.getpgrp())
    try:
        import tensorflow  # noqa: F401  (the point: paid before anyone waits for it)
    except Exception:  # noqa: BLE001 - no TensorFlow: no standby
        registry.unlink(registry.pid_path(KEY))
        return 1
    path = socket_path()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    registry.unlink(path)
    server.bind(path)
    server.listen(1)
    server.settimeout(args.idle)
    try:
        connection, _ = server.accept()
    except socket.timeout:
        return 0
    finally:
        server.close()
        registry.unlink(path)
        registry.unlink(registry.pid_path(KEY))
        lock.close()  # taken (or gone): the next standby may be made
    connection.settimeout(None)
    try:
        connection.sendall(TAKEN)
        message, fds = recv_fds(connection, 3)
    except (OSError, EOFError):
        return 1  # the claimant went away before handing a program over
    if len(fds) != 3:
        return 1
    request = json.loads(message.decode())
    before = memory.oom_kills()
    os.write(told, ("%s %s\n" % (request["key"], "-" if before is None else before)).encode())
    os.close(told)
    become(request, fds, connection)
    return 0  # not reached: become() exits


def become(request, fds, connection):
    """Turn this interpreter into the program of `request`, on the descriptors `fds`; exits with its code."""
    connection.sendall((json.dumps({"pid": os.getpid()}) + "\n").encode())
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    proctitle.set_title(commands.command_line(argv), os.path.basename(argv[0]))

    def watch_claimant():
        # The guard that handed the program over owns its lease: if that guard is gone, so is the program.
        try:
            while connection.recv(1):
                pass
        except OSError:
            pass
        groups.stop_group(os.getpgrp(), request.get("grace", 3.0))

    threading.Thread(target=watch_claimant, daemon=True).start()
    sys.exit(commands.run_program(argv))


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
                    if _read_exactly(sock, len(TAKEN)) == TAKEN:
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
        request = {"key": key, "argv": argv, "env": env, "cwd": os.getcwd(), "grace": grace}
        send_fds(sock, json.dumps(request).encode(), [devnull.fileno(), stdout, stderr])
    first = sock.makefile("r").readline()
    if not first:
        return None  # it died as it took the program: its owner says how
    return json.loads(first)["pid"]
