"""`stop`: every process group whose key matches, and the guards that watched them, gone."""

import os
import signal
import threading
import time

from tflab_guard import groups, registry

GUARD_FILE = "guard.pyz"


def stop(args):
    with registry.locked():
        found = [(path, registry.read_pid(path)) for _key, path in registry.matching(args.patterns)]
        targets = [(path, pgid) for path, pgid in found if pgid is not None]
    threads = [threading.Thread(target=groups.stop_group, args=(pgid, args.grace, args.force))
               for _, pgid in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with registry.locked():
        for path, _ in targets:
            registry.unlink(path)
        for _key, path in registry.matching(args.patterns, suffix=".exit"):
            registry.unlink(path)
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
    import fnmatch

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
        if (len(argv) > 3 and os.path.basename(argv[1]) == GUARD_FILE and argv[2] in ("run", "serve")
                and any(fnmatch.fnmatchcase(argv[3], pattern) for pattern in patterns)):
            found.append(int(entry))
    return found
