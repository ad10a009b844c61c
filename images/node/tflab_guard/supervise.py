"""Processes attached to tflab (`run`) and servers shared by its execs (`serve`)."""

import os
import signal
import subprocess
import sys
import threading
import time

from tflab_guard import commands, groups, leases, memory, proctitle, registry, standby


class Connection(threading.Thread):
    """Reads tflab's connection a line at a time: `go` releases; `stop`, or its end, stops."""

    def __init__(self):
        super().__init__(daemon=True, name="tflab-connection")
        self.released = threading.Event()
        self.closed = threading.Event()

    def run(self):
        try:
            for line in sys.stdin:
                word = line.strip()
                if word == "go":
                    self.released.set()
                elif word == "stop":
                    break
        except (OSError, ValueError):
            pass
        finally:
            self.closed.set()
            self.released.set()


def refuse(key, refusal, stream=None):
    """A program that cannot run here: its sentence, and its exit code recorded as a shell's would be."""
    code, sentence = refusal
    print(sentence, file=stream or sys.stderr, flush=True)
    registry.write_exit(key, code)
    return code


def run(args):
    plan = commands.plan_command(args.shell, args.argv)
    env = plan.environment(os.environ)
    connection = Connection()
    connection.start()
    refusal = commands.missing(plan, env)
    if refusal is not None:
        return refuse(args.key, refusal)
    watch = memory.OomWatch(args.key)
    python_program = commands.can_run_here(plan, env)
    # A line that sets its own variables runs as a new process: a warm interpreter read the old ones.
    if args.warm and python_program and not plan.env:
        claimed = standby.claim()
        if claimed is not None:
            if args.held:
                connection.released.wait()
            if connection.closed.is_set():
                claimed.close()
                return 143
            return watch.finish(standby.run_in_standby(args.key, plan.argv, env, claimed, 1, 2, args.grace,
                                                       connection.closed))
    if args.preload and python_program:
        return run_in_process(args, plan, env, connection, watch)
    if args.held:
        connection.released.wait()
        if connection.closed.is_set():
            return 143
    child = subprocess.Popen(plan.argv, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    registry.write_pid(args.key, child.pid)

    def forward(_signum, _frame):
        groups.stop_group(child.pid, args.grace)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)

    def on_close():
        connection.closed.wait()
        groups.stop_group(child.pid, args.grace)

    threading.Thread(target=on_close, daemon=True).start()
    return watch.finish(groups.exit_code(child.wait()))


def run_in_process(args, plan, env, connection, watch):
    """Import TensorFlow now (with the program's environment), then run the program as __main__ once released."""
    os.environ.update(plan.env)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group leader (a docker exec process leads its session)
    pgid = os.getpgrp()
    registry.write_pid(args.key, pgid)

    def on_close():
        connection.closed.wait()
        groups.stop_group(pgid, args.grace)

    threading.Thread(target=on_close, daemon=True).start()
    try:
        import tensorflow  # noqa: F401  (the point: paid while the servers start)
    except Exception:  # noqa: BLE001 - the program will import it itself and say why
        pass
    if args.held:
        connection.released.wait()
    if connection.closed.is_set():
        return 143
    proctitle.set_title(commands.command_line(plan.argv), os.path.basename(plan.argv[0]))
    return watch.finish(commands.run_program(plan.argv))


def serve(args):
    plan = commands.plan_command(args.shell, args.argv)
    env = plan.environment(os.environ)
    if args.log:
        os.makedirs(os.path.dirname(args.log) or ".", exist_ok=True)
    log = open(args.log, "ab", buffering=0) if args.log else open(os.devnull, "wb")
    refusal = commands.missing(plan, env)
    if refusal is not None:
        code, sentence = refusal
        log.write((sentence + "\n").encode())
        registry.write_exit(args.key, code)
        return code
    watch = memory.OomWatch(args.key)
    use_standby = args.warm and commands.can_run_here(plan, env) and not plan.env
    claimed = standby.claim() if use_standby else None
    closed = threading.Event()
    if claimed is not None:
        result = {}
        program = threading.Thread(target=lambda: result.update(code=standby.run_in_standby(
            args.key, plan.argv, env, claimed, log.fileno(), log.fileno(), args.grace, closed)), daemon=True)
        program.start()
        running = program.is_alive
    else:
        child = subprocess.Popen(plan.argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True)
        registry.write_pid(args.key, child.pid)
        running = lambda: child.poll() is None  # noqa: E731
    started = time.monotonic()
    unheld_since = None
    while running():
        time.sleep(0.2)
        if args.lease is None or leases.holders(args.lease):
            unheld_since = None
            continue
        unheld_since = unheld_since or time.monotonic()
        if time.monotonic() - started > 10 and time.monotonic() - unheld_since > 0.5:
            closed.set()
            if claimed is None:
                groups.stop_group(child.pid, args.grace)
    if claimed is not None:
        program.join()
        return watch.finish(result.get("code", 137), log)
    return watch.finish(groups.exit_code(child.wait()), log)
