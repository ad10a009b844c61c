"""`stop`: the processes tflab started under matching keys, and the guards that own them, gone.

Found in the registry's records (pid and start time, written by the guard that started
each), never by a pattern over /proc: a stop of `run:train:*` reaches only what this node's
guards started under such keys, never another lab's processes, nor a process that merely
looks like a guard.
"""

import os
import signal
import threading

from tflab_guard import groups, registry


def stop(args):
    stop_keys(args.patterns, args.grace, args.force, args.forget)
    return 0


def stop_keys(patterns, grace, force=False, forget=False):
    """Stop what was started under keys matching `patterns` (TERM, KILL after `grace`; `force`: KILL at once), and
    their guards; `forget`: and how they ended."""
    with registry.locked():
        keys = sorted({key for key, _ in registry.matching(patterns)}
                      | {key for key, _ in registry.matching(patterns, suffix=".guard")})
        targets = [(key, registry.read_pid(key)) for key in keys]
        owners = {key: registry.guard_identity(key) for key in keys}
    for key, pgid in targets:
        registry.mark_stopped(key)
        guard = owners[key]
        if pgid is None and guard is not None:  # held, its program not started: its guard says how it ended
            try:
                os.kill(guard[0], signal.SIGTERM)
            except OSError:
                pass
    threads = [threading.Thread(target=groups.stop_group, args=(pgid, grace, force))
               for _, pgid in targets if pgid is not None]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Stopped means gone: the guards that own those processes too (they end once their program
    # has, having written how it ended); one that lingers past the grace is killed. Each is waited on
    # as the process it is: its record goes a moment before the process has exited.
    for key, _ in targets:
        owner = owners[key]
        if owner is not None:
            def alive(owner=owner):
                return owner[0] if registry.lives(owner) else None

            if not registry.wait_gone(alive, 1 if force else grace + 1):
                try:
                    os.kill(owner[0], signal.SIGKILL)
                except OSError:
                    pass
                registry.wait_gone(alive, 2)
        registry.unlink(registry.guard_path(key))
    if forget:
        # A new run of these keys starts now: an earlier ending must not answer for it (a probe would take
        # the new server for one that ended before serving).
        with registry.locked():
            for key, _ in registry.matching(patterns, suffix=".exit"):
                registry.forget(key)
