"""Locks between tflab processes on this host (flock: a lock dies with the process that held it).

A task's lock (`task-TASK.lock` in the lab's state folder) keeps a run and the execs of a task
apart: `tflab run` holds it alone for its whole length; each `tflab exec` of the task holds it
shared, so execs in several terminals go together, but never beside a run of the same task.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock for the length of a block (waits for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def try_lock(path: Path, shared: bool = False) -> IO[str] | None:
    """The lock at `path` if it can be had now (held while the returned file is open), else None."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a")
    try:
        fcntl.flock(handle, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def task_lock_path(state_dir: Path, task: str) -> Path:
    """Where a task's lock lives (task names are words: safe in a file name)."""
    return state_dir / f"task-{task}.lock"
