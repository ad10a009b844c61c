"""tflab's leases renewed on the host: one file per lease in the lab's runs folder, which every node mounts at /runs.

A node's guard stops what it runs once tflab's lease lapses (tflab is gone). The lease used to be renewed only by
`renew` words on each process's exec stream, which the node's guard reads and writes down: a renewal then needed
the guard scheduled inside the node's CPU quota, which it shares with the program's TensorFlow import, and the
exec stream flowing. Here tflab also renews every lease it holds by setting the mtime of
`RUNS/.tflab/leases/LEASE` (tflab_guard.protocol.HOST_LEASES in a node), from one thread of its own: nothing of
the node takes part in it, and the guard reads a file's age when it looks (tflab_guard.leases).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tflab_guard import protocol

from tflab.host.fanout import background

LEASES_DIR = Path(".tflab") / "leases"  # in the lab's runs folder: /runs/.tflab/leases in every node


class HostLeases:
    """The leases this tflab holds, each renewed every protocol.RENEW_EVERY_S by one thread."""

    def __init__(self) -> None:
        self._held: dict[Path, int] = {}  # path -> how many holders in this process
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, runs_dir: Path, lease: str) -> Path:
        """Renew `lease` from now on (until `release`); its file's path."""
        path = runs_dir / LEASES_DIR / lease
        with self._lock:
            self._held[path] = self._held.get(path, 0) + 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = background(self._renewing, name="host-leases")
        renew(path)
        return path

    def release(self, path: Path) -> None:
        """Stop renewing (the file goes with its last holder here: a lapse of a stopped process is no news)."""
        with self._lock:
            count = self._held.get(path, 0) - 1
            if count > 0:
                self._held[path] = count
                return
            self._held.pop(path, None)
        try:
            path.unlink()
        except OSError:
            pass

    def _renewing(self) -> None:
        event = threading.Event()
        while True:
            with self._lock:
                paths = list(self._held)
            for path in paths:
                renew(path)
            event.wait(protocol.RENEW_EVERY_S)


def renew(path: Path) -> None:
    try:
        os.utime(path, None)
    except FileNotFoundError:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        except OSError:
            pass
    except OSError:
        pass


LEASES = HostLeases()  # this process's
