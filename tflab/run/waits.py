"""Where a process waits, read from its stacks (py-spy's dump, `tflab_guard.stacks`) as a cluster's expert reads them.

Pure: a dump's text in, a `Wait` out. The kinds, each named only from what the stack shows:
- `serves`: a thread in TensorFlow's `Server.join()` (server_lib.py): the process is a server, and does what a
  parameter server does (it never ends by itself);
- `session`: the main thread in TF1's SessionManager (session_manager.py: MonitoredTrainingSession and its kin
  waiting for the chief to make or restore the session), the late worker's wait;
- `tensorflow`: the main thread inside TensorFlow or Keras (a collective, a gRPC call, a coordination service);
- `own`: the main thread outside TensorFlow, in the program's own code or a library it called itself (a retry
  loop's sleep, a socket it waits on): the program's own wait;
- `unknown`: no stack could be read (no dump, or none of a Python main thread).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import StrEnum

# A frame of py-spy's dump (--full-filenames): `    function (file:line)`.
FRAME = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
THREAD = re.compile(r'^Thread (?P<id>\S+)(?: \((?P<state>[^)]*)\))?(?:: "(?P<name>[^"]*)")?\s*$')
PROCESS = re.compile(r"^Process (?P<pid>\d+): ")
LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d(\.\d+)?/|^<frozen ")
TENSORFLOW = re.compile(r"/(site|dist)-packages/(tensorflow|tensorflow_core|tensorflow_estimator|keras|tf_keras)/")
SHOWN_FRAMES = 2  # the innermost frames a summary line shows, then the program's own innermost frame


class WaitKind(StrEnum):
    SERVES = "serves"
    SESSION = "session"
    TENSORFLOW = "tensorflow"
    OWN = "own"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def in_tensorflow(self) -> bool:
        return TENSORFLOW.search(self.file) is not None

    @property
    def in_library(self) -> bool:
        return LIBRARY.search(self.file) is not None

    def __str__(self) -> str:
        return f"{self.function} ({os.path.basename(self.file)}:{self.line})"


@dataclass(frozen=True)
class Thread:
    name: str  # "" where py-spy could not read it
    idle: bool
    frames: tuple[Frame, ...]  # innermost first, as py-spy prints them
    pid: int | None = None
    id: str = ""  # the OS thread's id (the process's own pid for its main thread)

    @property
    def main(self) -> bool:
        return self.name == "MainThread" or (not self.name and self.pid is not None and self.id == str(self.pid))


@dataclass(frozen=True)
class Wait:
    """Where a process waits: its kind, the main thread's innermost frames, and a sentence of it."""

    kind: WaitKind
    frames: tuple[Frame, ...] = ()

    @property
    def known(self) -> bool:
        return self.kind != WaitKind.UNKNOWN

    @property
    def at(self) -> str:
        """The innermost frames and the program's own innermost one: `join (server_lib.py:406) ← … ← main (ps.py:9)`."""
        shown = list(self.frames[:SHOWN_FRAMES])
        own = next((frame for frame in self.frames if not frame.in_library), None)
        parts = [str(frame) for frame in shown]
        if own is not None and own not in shown:
            parts += ["…", str(own)]
        return " ← ".join(parts)

    def sentence(self, node: str) -> str:
        if self.kind == WaitKind.SERVES:
            return f"{node} serves: it waits in TensorFlow's Server.join() ({self.at})"
        if self.kind == WaitKind.SESSION:
            return f"{node} waits in TF1's SessionManager for the chief's session ({self.at})"
        if self.kind == WaitKind.TENSORFLOW:
            return f"{node} waits in TensorFlow: {self.at}"
        if self.kind == WaitKind.OWN:
            return f"{node} waits in the program's own code: {self.at}"
        return f"{node} waits; where could not be read"


def threads(dump: str) -> list[Thread]:
    """The threads of a py-spy dump (of one process or several, one after another)."""
    found: list[Thread] = []
    pid: int | None = None
    current: tuple[str, bool, list[Frame], str] | None = None

    def close() -> None:
        if current is not None:
            found.append(Thread(current[0], current[1], tuple(current[2]), pid, current[3]))

    for line in dump.splitlines():
        if (process := PROCESS.match(line)) is not None:
            close()
            current, pid = None, int(process["pid"])
        elif (thread := THREAD.match(line)) is not None:
            close()
            current = (thread["name"] or "", "idle" in (thread["state"] or ""), [], thread["id"])
        elif current is not None and (frame := FRAME.match(line)) is not None:
            current[2].append(Frame(frame["function"], frame["file"], int(frame["line"])))
    close()
    return found


def where_it_waits(dump: str | None) -> Wait:
    """What the stacks of one node's process say of where it waits."""
    found = threads(dump or "")
    main = next((t for t in found if t.main and t.frames), None)
    if main is None:
        return Wait(WaitKind.UNKNOWN)
    for thread in found:
        if any(f.function.endswith("join") and f.file.endswith("server_lib.py") for f in thread.frames):
            return Wait(WaitKind.SERVES, thread.frames)
    waits = [i for i, f in enumerate(main.frames) if f.file.endswith("session_manager.py")]
    if waits:  # shown from SessionManager's own call (wait_for_session, prepare_session) outwards
        return Wait(WaitKind.SESSION, main.frames[waits[-1]:])
    if any(f.in_tensorflow for f in main.frames):
        return Wait(WaitKind.TENSORFLOW, main.frames)
    return Wait(WaitKind.OWN, main.frames)
