"""What a run's state machine knows of one node's process: its role, attempts, exit, verdict, the steps it printed."""

from __future__ import annotations

from dataclasses import dataclass, field

from tflab.plan import progress
from tflab.run.waits import Wait
from tflab.run.words import Verdict


@dataclass
class NodeRun:
    """What the machine knows of one node's process."""

    name: str
    role: str
    attempt: int = 0
    started: float | None = None  # released, for finishers
    ended: float | None = None
    exit_code: int | None = None
    verdict: Verdict = Verdict.PENDING
    reason: str | None = None
    signal: str | None = None  # the signal that ended it (SIGTERM), by name
    ended_by: str | None = None  # exited, stopped, crashed, outside, oom, lease, refused, lost
    last_output: float | None = None
    last_said: float | None = None  # its last line of its own (not an error TensorFlow's runtime logged)
    last_busy: float | None = None  # when it last used more than a sliver of a CPU (the cluster's figures)
    leader_gone: float | None = None  # when it last said the chief's coordination service is gone
    steps: list[tuple[float, int]] = field(default_factory=list)
    rates: list[tuple[float, float]] = field(default_factory=list)  # rates the program reported itself
    global_steps: list[tuple[float, int]] = field(default_factory=list)  # the cluster's step, as it printed it
    global_rates: list[tuple[float, float]] = field(default_factory=list)  # the cluster's steps/s it reported
    serving: bool = False
    quality: list[tuple[float, str, float]] = field(default_factory=list)  # (t, metric, value) as printed
    stack: str | None = None  # where it waited, as its stacks were read (py-spy's dump), when tflab asked
    wait: Wait | None = None  # what that dump says (run/waits)

    @property
    def running(self) -> bool:
        return self.started is not None and self.ended is None

    @property
    def progressed(self) -> bool:
        """Whether it reported any training progress (a step, or a rate; its own or the cluster's)."""
        return bool(self.steps or self.rates or self.global_steps or self.global_rates)

    @property
    def last_progress(self) -> float | None:
        """When it last reported progress."""
        times = [t for series in (self.steps, self.rates, self.global_steps, self.global_rates) for t, _ in series[-1:]]
        return max(times) if times else None

    @property
    def last_active(self) -> float | None:
        """When it last reported progress or printed a line of its own."""
        times = [x for x in (self.last_progress, self.last_output) if x is not None]
        return max(times) if times else None

    def rate(self, window_s: float | None = None) -> float | None:
        """Its own steps per second (over the last `window_s` seconds), where it says its own steps."""
        return progress.node_rate(self.steps, self.rates, window_s)

    def global_rate(self, window_s: float | None = None) -> float | None:
        """The cluster's steps per second as this node saw them (its global step), where it says that."""
        return progress.node_rate(self.global_steps, self.global_rates, window_s)

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended if self.ended is not None else self.started) - self.started
