"""tflab's guard: how tflab starts, holds, watches and stops processes inside a node.

Every process tflab starts in a node runs under this guard, which ties it to tflab:

  guard.py run KEY [--held] [--preload] [--grace S] -- ARGV | --shell CMD
      Attached to tflab: its standard input is tflab's connection. A line `go` releases a
      `--held` process; the end of input (tflab stopped it, or tflab died: even `kill -9`
      closes the connection) stops the process's whole group: SIGTERM, then SIGKILL after
      the grace. With --preload, a Python program that imports TensorFlow gets its
      interpreter and TensorFlow ready while it is held, then runs unchanged as __main__
      with its own argv once released.
  guard.py serve KEY [--lease LEASE] [--log FILE] -- ARGV | --shell CMD
      A server shared by several `tflab exec`s: it lives while a holder of LEASE lives
      (without --lease, until `stop`: TensorBoard).
  guard.py run ... --warm
      A Python program is handed to the node's standby (below) when there is one: it runs
      there, with TensorFlow imported already.
  guard.py standby [--idle S]  imports TensorFlow, then waits (on a unix socket) to become the
      next --warm program; leaves after S seconds unused. One per node.
  guard.py warm                exits 0 while the node's standby is ready.
  guard.py hold LEASE          holds LEASE until its standard input ends.
  guard.py held LEASE          exits 0 while some holder of LEASE lives.
  guard.py probe HOST:PORT [--key KEY] [--timeout S]
      exits 0 once HOST:PORT accepts (retrying name resolution: a swarm service's name
      resolves only once its task runs), 3 if KEY's process ended first, 4 on timeout.
  guard.py alive KEY           exits 0 while KEY's process lives.
  guard.py stop PATTERN... [--grace S] [--force]
      stops every process group whose key matches a pattern (leftovers of an earlier run).

Pid files live in /run/tflab: KEY.pid holds `PGID STARTTIME`, KEY.exit the exit code.
Standard library only: it runs under the node's own Python.
"""

import argparse
import fnmatch
import glob
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

STATE = os.environ.get("TFLAB_GUARD_STATE", "/run/tflab")  # tests point it elsewhere
SHELL_CHARS = set("|&;<>()$`\\*?[]{}~#\n'\"")
TF_IMPORT = re.compile(r"^\s*(import\s+tensorflow|from\s+tensorflow)\b", re.MULTILINE)


def pid_path(key):
    return os.path.join(STATE, key + ".pid")


def exit_path(key):
    return os.path.join(STATE, key + ".exit")


def start_time(pid):
    """The kernel's start time of `pid` (tells a live process from a recycled pid)."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def write_pid(key, pgid):
    os.makedirs(STATE, exist_ok=True)
    try:
        os.unlink(exit_path(key))
    except OSError:
        pass
    with open(pid_path(key) + ".tmp", "w") as handle:
        handle.write("%d %s\n" % (pgid, start_time(pgid)))
    os.replace(pid_path(key) + ".tmp", pid_path(key))


def write_exit(key, code):
    try:
        with open(exit_path(key), "w") as handle:
            handle.write("%d\n" % code)
        os.unlink(pid_path(key))
    except OSError:
        pass


def read_pid(key_or_path):
    """The live process group of a pid file, or None (a stale file is removed)."""
    path = key_or_path if key_or_path.endswith(".pid") else pid_path(key_or_path)
    try:
        with open(path) as handle:
            fields = handle.read().split()
        pgid, started = int(fields[0]), fields[1] if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None
    if start_time(pgid) is None or (started not in (None, "None") and start_time(pgid) != started):
        try:
            os.unlink(path)
        except OSError:
            pass
        return None
    return pgid


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid, grace, force=False):
    """SIGTERM the group, SIGKILL what is left after `grace` seconds (some TF servers ignore TERM)."""
    if not force:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def exit_code(status):
    """A Popen return code as a shell reports it (128 + signal for a killed process)."""
    return 128 - status if status < 0 else status


def plan_command(args):
    """('shell', argv) for shell text, ('python', argv) for `python script.py ...`, else ('exec', argv)."""
    if args.shell is None:
        argv = args.argv
    elif SHELL_CHARS & set(args.shell):
        return "shell", ["sh", "-c", args.shell]
    else:
        argv = shlex.split(args.shell)
    if not argv:
        raise SystemExit("tflab guard: no command")
    name = os.path.basename(argv[0])
    if len(argv) >= 2 and re.match(r"^python(3(\.\d+)?)?$", name) and argv[1].endswith(".py"):
        return "python", argv
    return "exec", argv


def same_python(found):
    """Whether the interpreter at `found` is this one, in the same environment (venv) too."""
    here = os.path.abspath(sys.executable)
    there = os.path.abspath(found)
    if os.path.dirname(there) == os.path.dirname(here):
        return True
    in_venv = any(os.path.exists(os.path.join(os.path.dirname(os.path.dirname(p)), "pyvenv.cfg"))
                  for p in (here, there))
    return not in_venv and os.path.realpath(there) == os.path.realpath(here)


def can_run_here(argv):
    """Whether `python script.py` would run under this very interpreter, on a TensorFlow program."""
    found = shutil.which(argv[0])
    if found is None or not same_python(found):
        return False
    try:
        with open(argv[1], encoding="utf-8", errors="replace") as handle:
            return bool(TF_IMPORT.search(handle.read()))
    except OSError:
        return False


class Connection(threading.Thread):
    """Reads tflab's connection: `go` releases, the end of it stops."""

    def __init__(self):
        super().__init__(daemon=True, name="tflab-connection")
        self.released = threading.Event()
        self.closed = threading.Event()

    def run(self):
        try:
            for line in sys.stdin:
                if line.strip() == "go":
                    self.released.set()
        except (OSError, ValueError):
            pass
        finally:
            self.closed.set()
            self.released.set()


def run(args):
    kind, argv = plan_command(args)
    connection = Connection()
    connection.start()
    python_program = kind == "python" and can_run_here(argv)
    if args.warm and python_program:
        claimed = claim_standby()
        if claimed is not None:
            if args.held:
                connection.released.wait()
            if connection.closed.is_set():
                claimed.close()
                return 143
            return run_in_standby(args.key, argv, claimed, 1, 2, args.grace, connection.closed)
    if args.preload and python_program:
        return run_in_process(args, argv, connection)
    if args.held:
        connection.released.wait()
        if connection.closed.is_set():
            return 143
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    write_pid(args.key, child.pid)

    def forward(_signum, _frame):
        stop_group(child.pid, args.grace)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)

    def on_close():
        connection.closed.wait()
        stop_group(child.pid, args.grace)

    threading.Thread(target=on_close, daemon=True).start()
    code = exit_code(child.wait())
    write_exit(args.key, code)
    return code


def run_in_process(args, argv, connection):
    """Import TensorFlow now, then run the program as __main__ in this interpreter once released."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group leader (a docker exec process leads its session)
    pgid = os.getpgrp()
    write_pid(args.key, pgid)

    def on_close():
        connection.closed.wait()
        stop_group(pgid, args.grace)

    threading.Thread(target=on_close, daemon=True).start()
    try:
        import tensorflow  # noqa: F401  (the point: paid while the servers start)
    except Exception:  # noqa: BLE001 - the program will import it itself and say why
        pass
    if args.held:
        connection.released.wait()
    if connection.closed.is_set():
        return 143
    code = run_program(argv)
    write_exit(args.key, code)
    return code


def run_program(argv):
    """`python script.py args` in this interpreter: the script as __main__, with its own argv and path."""
    script = argv[1]
    sys.argv = argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - shown as Python shows it, exit code 1
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


# -- the warm standby ----------------------------------------------------------------------------
# One interpreter per node with TensorFlow imported, waiting on a unix socket. A `run --warm`
# hands it the program (argv, environment, folder, and its own stdout and stderr), and it
# becomes the program: no import to pay when a run starts. It is made again after each run
# (tflab asks), and leaves after a while unused.

STANDBY_KEY = "standby"


def standby_socket():
    return os.path.join(STATE, "standby.sock")


def standby(args):
    if read_pid(STANDBY_KEY) is not None:
        return 0  # this node has one already
    try:
        os.setsid()
    except OSError:
        pass
    write_pid(STANDBY_KEY, os.getpgrp())
    try:
        import tensorflow  # noqa: F401  (the point: paid before anyone waits for it)
    except Exception:  # noqa: BLE001 - no TensorFlow: no standby
        write_exit(STANDBY_KEY, 1)
        return 1
    path = standby_socket()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except OSError:
        pass
    server.bind(path)
    server.listen(1)
    server.settimeout(args.idle)
    try:
        connection, _ = server.accept()
    except socket.timeout:
        return 0
    finally:
        server.close()
        for stale in (path, pid_path(STANDBY_KEY)):
            try:
                os.unlink(stale)
            except OSError:
                pass
    connection.settimeout(None)
    message, fds, _flags, _address = socket.recv_fds(connection, 1 << 20, 3)
    if len(fds) != 3 or not message:
        return 1
    request = json.loads(message.decode())
    connection.sendall((json.dumps({"pid": os.getpid()}) + "\n").encode())
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])

    def watch_requester():
        # The guard that handed the program over stands for tflab: if it goes, so does the program.
        try:
            while connection.recv(1):
                pass
        except OSError:
            pass
        stop_group(os.getpgrp(), request.get("grace", 3.0))

    threading.Thread(target=watch_requester, daemon=True).start()
    code = run_program(request["argv"])
    try:
        connection.sendall((json.dumps({"exit": code}) + "\n").encode())
    except OSError:
        pass
    return code


def claim_standby(wait_s=60.0):
    """A connection to this node's standby, waiting while one is still importing; None when there is none."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(standby_socket())
            return sock
        except OSError:
            sock.close()
        if read_pid(STANDBY_KEY) is None:
            return None  # none importing either
        time.sleep(0.05)
    return None


def run_in_standby(key, argv, standby_sock, stdout, stderr, grace, closed):
    """Hand `argv` to the claimed standby and wait for its end; its exit code."""
    with open(os.devnull, "rb") as devnull:
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "grace": grace}
        socket.send_fds(standby_sock, [json.dumps(request).encode()], [devnull.fileno(), stdout, stderr])
    replies = standby_sock.makefile("r")
    first = replies.readline()
    if not first:
        return 137  # it died as it took the program
    pid = json.loads(first)["pid"]
    write_pid(key, pid)

    def on_close():
        closed.wait()
        stop_group(pid, grace)

    threading.Thread(target=on_close, daemon=True).start()
    last = replies.readline()
    code = json.loads(last)["exit"] if last else 137  # no word from it: it was killed
    # Its end is ours only once it is gone (an interpreter with TensorFlow takes a moment to exit),
    # with anything it started.
    deadline = time.monotonic() + grace
    while group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_group(pid, grace)
    write_exit(key, code)
    return code


def holders(lease):
    folder = os.path.join(STATE, "holds", lease)
    return [p for p in glob.glob(os.path.join(folder, "*.pid")) if read_pid(p) is not None]


def serve(args):
    kind, argv = plan_command(args)
    if args.log:
        os.makedirs(os.path.dirname(args.log) or ".", exist_ok=True)
    log = open(args.log, "ab", buffering=0) if args.log else open(os.devnull, "wb")
    claimed = claim_standby() if args.warm and kind == "python" and can_run_here(argv) else None
    closed = threading.Event()
    if claimed is not None:
        result = {}
        program = threading.Thread(target=lambda: result.update(code=run_in_standby(
            args.key, argv, claimed, log.fileno(), log.fileno(), args.grace, closed)), daemon=True)
        program.start()
        running = program.is_alive
    else:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        write_pid(args.key, child.pid)
        running = lambda: child.poll() is None  # noqa: E731
    started = time.monotonic()
    unheld_since = None
    while running():
        time.sleep(0.2)
        if args.lease is None or holders(args.lease):
            unheld_since = None
            continue
        unheld_since = unheld_since or time.monotonic()
        if time.monotonic() - started > 10 and time.monotonic() - unheld_since > 0.5:
            closed.set()
            if claimed is None:
                stop_group(child.pid, args.grace)
    if claimed is not None:
        program.join()
        return result.get("code", 137)
    code = exit_code(child.wait())
    write_exit(args.key, code)
    return code


def hold(args):
    folder = os.path.join(STATE, "holds", args.lease)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "%d.pid" % os.getpid())
    with open(path, "w") as handle:
        handle.write("%d %s\n" % (os.getpid(), start_time(os.getpid())))
    print("holding", flush=True)
    try:
        for _line in sys.stdin:
            pass
    finally:
        os.unlink(path)
    return 0


def warm(_args):
    """Exit 0 when this node's standby is ready (imported and listening)."""
    return 0 if read_pid(STANDBY_KEY) is not None and os.path.exists(standby_socket()) else 1


def held(args):
    return 0 if holders(args.lease) else 1


def probe(args):
    host, _, port = args.address.rpartition(":")
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if args.key and os.path.exists(exit_path(args.key)):
            return 3
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return 0
        except OSError:
            time.sleep(0.05)
    return 4


def alive(args):
    return 0 if read_pid(args.key) is not None else 1


def stop(args):
    groups = []
    for path in glob.glob(os.path.join(STATE, "*.pid")):
        key = os.path.basename(path)[:-4]
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in args.patterns):
            pgid = read_pid(path)
            if pgid is not None:
                groups.append((path, pgid))
    threads = [threading.Thread(target=stop_group, args=(pgid, args.grace, args.force)) for _, pgid in groups]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for path, _ in groups:
        try:
            os.unlink(path)
        except OSError:
            pass
    for path in glob.glob(os.path.join(STATE, "*.exit")):
        if any(fnmatch.fnmatchcase(os.path.basename(path)[:-5], pattern) for pattern in args.patterns):
            os.unlink(path)
    # Stopped means gone: the guards that started those groups too (they end once their
    # program has; one that lingers past the grace is killed).
    deadline = time.monotonic() + (0 if args.force else args.grace)
    while True:
        left = wrappers(args.patterns)
        if not left:
            return 0
        if time.monotonic() >= deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            deadline = float("inf")
        time.sleep(0.05)


def wrappers(patterns):
    """Pids of the guards (`run`, `serve`) of keys matching `patterns`, this one excepted."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                argv = handle.read().decode(errors="replace").split("\0")
            with open("/proc/%s/stat" % entry) as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie is gone but for its parent's wait
        except (OSError, IndexError):
            continue
        if (len(argv) > 3 and argv[1].endswith("guard.py") and argv[2] in ("run", "serve")
                and any(fnmatch.fnmatchcase(argv[3], pattern) for pattern in patterns)):
            found.append(int(entry))
    return found


def command_args(parser):
    parser.add_argument("--shell", help="a command line (run by sh when it needs a shell)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tflab-guard", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    p = verbs.add_parser("run")
    p.add_argument("key")
    p.add_argument("--held", action="store_true")
    p.add_argument("--preload", action="store_true")
    p.add_argument("--warm", action="store_true", help="hand a Python program to this node's standby")
    p.add_argument("--grace", type=float, default=3.0)
    command_args(p)
    p = verbs.add_parser("serve")
    p.add_argument("key")
    p.add_argument("--warm", action="store_true", help="hand a Python program to this node's standby")
    p.add_argument("--lease", help="live while a holder of it lives (default: until stopped)")
    p.add_argument("--log")
    p.add_argument("--grace", type=float, default=3.0)
    command_args(p)
    p = verbs.add_parser("hold")
    p.add_argument("lease")
    p = verbs.add_parser("standby")
    p.add_argument("--idle", type=float, default=1800.0, help="leave after this many seconds unused")
    p = verbs.add_parser("warm")
    p = verbs.add_parser("held")
    p.add_argument("lease")
    p = verbs.add_parser("probe")
    p.add_argument("address")
    p.add_argument("--key")
    p.add_argument("--timeout", type=float, default=120.0)
    p = verbs.add_parser("alive")
    p.add_argument("key")
    p = verbs.add_parser("stop")
    p.add_argument("patterns", nargs="+")
    p.add_argument("--grace", type=float, default=3.0)
    p.add_argument("--force", action="store_true")
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is the command, untouched by option parsing.
    split = words.index("--") if "--" in words else len(words)
    args = parser.parse_args(words[:split])
    args.argv = words[split + 1:]
    handlers = {"run": run, "serve": serve, "hold": hold, "held": held, "standby": standby, "warm": warm, "probe": probe, "alive": alive, "stop": stop}
    return handlers[args.verb](args)


if __name__ == "__main__":
    sys.exit(main())
