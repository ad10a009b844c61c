"""One watcher for a node's process, whatever started it (`tflab run`, `tflab exec`, `tflab exec NODE -- CMD`).

It turns the process's output and end into the run's events the same way everywhere: each
whole line is a sign of life (TensorFlow's chatter is not), with the metrics it printed
(plan/quality) and whether it is TensorFlow's runtime talking; each update of a line that
rewrites itself is read for progress (steps, steps/s); the last meaningful line is kept as
the program's result; and the end, as its connection told it (engine/attached.py: the
guard's end line), becomes the Exited event, asked of the node only where the line was lost.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

from tflab_guard import protocol

from tflab.engine import guardwait
from tflab.engine.attached import End
from tflab.engine.executors import Executor
from tflab.plan import progress, quality
from tflab.run.events import Event, Exited, Printed


def exited_event(node: str, t: float, end: End) -> Exited:
    """The Exited event of a process's end as its connection told it (with the guard's record where it came): its
    reason says it in words, the guard's sentence for an end it did not exit by itself first ('killed by SIGKILL
    from outside tflab'), then what the connection added ('its container stopped')."""
    ending = end.ending
    said = [ending.sentence()] if ending is not None and ending.reason != protocol.EXITED else []
    said += [end.reason] if end.reason else []
    return Exited(node, end.code, t, "; ".join(said) or None, signal=ending.signal if ending else None,
                  ended_by=ending.reason if ending else None)


class ProcessWatch:
    """Reads one node process into `events`: `output` gets its chunks as they come, `exited` its end (once)."""

    def __init__(self, node: str, key: str, executor: Executor, events: queue.SimpleQueue[Event],
                 clock: Callable[[], float], progress_pattern: str | None = None,
                 show: Callable[[str], None] | None = None, on_step: Callable[[float], None] | None = None,
                 update: Callable[[str], None] | None = None) -> None:
        self.node = node
        self.key = key
        self.executor = executor
        self.events = events
        self.clock = clock
        self.show = show  # each whole line, as it is shown (a line that redraws itself: its last state)
        self.update = update  # each redraw of a line not ended yet (a progress bar), as a terminal shows it
        self.on_step = on_step  # the time of each progress reading
        self.reader = progress.ProgressReader(progress_pattern)
        self.own_pattern = progress.check_pattern(progress_pattern) if progress_pattern else None
        # each stream split into lines of its own: a line of stderr cut by a chunk's end must not run into stdout's
        self.lines = (progress.LineSplitter(), progress.LineSplitter())
        self.updates = (progress.LineSplitter(updates=True), progress.LineSplitter(updates=True))
        self.last_line: str | None = None  # the program's result: its own last meaningful line

    def output(self, chunk: bytes, is_err: bool) -> None:
        for text in self.updates[is_err].feed(chunk):
            self._progress(text)
        for text in self.lines[is_err].feed(chunk):
            self._line(text)
        pending = self.lines[is_err].pending()
        if self.update is not None and "\r" in pending:
            self.update(progress.displayed(pending))

    def exited(self, end: End) -> None:
        """The process's end: what is left of its lines read first, then its Exited (always, from a `finally`)."""
        try:
            for text in self.updates[0].rest() + self.updates[1].rest():
                self._progress(text)
            for text in self.lines[0].rest() + self.lines[1].rest():
                self._line(text)
            end = guardwait.learn_exit(self.executor, self.node, self.key, end)
        finally:
            self.events.put(exited_event(self.node, self.clock(), end))

    def _progress(self, text: str) -> None:
        """A line, or one update of a line that rewrites itself: the progress it reports, if any."""
        reading = self.reader.read(text)
        if reading is None:
            return
        now = self.clock()
        if self.on_step is not None:
            self.on_step(now)
        self.events.put(Printed(self.node, now, reading.step, reading.rate, reading.global_step, reading.global_rate))

    def _line(self, text: str) -> None:
        """A whole line: a sign of life, its metrics and the program's result kept; then shown."""
        if text.strip() and not progress.is_noise(text):  # TensorFlow's chatter is no sign of life
            # a program's result is its own last line: not an error TensorFlow logs at exit
            # (MultiWorkerMirroredStrategy's "tasks have crashed" of a run that succeeded)
            if not (progress.tensorflow_error(text) and self.last_line):
                self.last_line = text.rsplit("\r", 1)[-1]
            metrics = quality.read(text.rsplit("\r", 1)[-1], self.own_pattern)
            self.events.put(Printed(self.node, self.clock(), leader_gone=bool(progress.LEADER_GONE.search(text)),
                                    quality=tuple(metrics.items()), runtime=progress.tensorflow_error(text)))
        if self.show is not None:
            self.show(progress.displayed(text) if "\r" in text or "\b" in text else text)
