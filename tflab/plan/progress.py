"""Training progress read from what programs print, as they print it. Pure.

The lines people's programs really print, each giving a step (or a rate):

- `step 300`, `global step 3`, `step=5`, TF1's hooks' `loss = 0.1, step = 300`
- the classic books' `After 100 training steps (100 global steps), loss on training batch is 0.71`
  (the global step counts)
- TF1's hooks' `global_step/sec: 123.4` (a rate, as it is)
- Keras' `Epoch 2/5` and then `120/469 [=====>....]` or `120/469 ━━━━━━━━` (step = the batches
  of the epochs before, and this one's)
- a task's own pattern (tflab.yaml `progress: REGEX`), with a named group `step` or `rate`

The late-worker rule, the steps/s of the run summary and the cluster metrics all read steps here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

STEP_PATTERN = re.compile(r"\bstep[ =:#]+(\d+)", re.IGNORECASE)
BOOK_PATTERN = re.compile(r"\bAfter (\d+) training steps? \((\d+) global steps?\)", re.IGNORECASE)
RATE_PATTERN = re.compile(r"\bglobal_step/sec: ([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)")
EPOCH_PATTERN = re.compile(r"^\s*Epoch (\d+)/(\d+)\s*$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # Keras 3 colours its bar even into a pipe
KERAS_BAR = re.compile(r"^\s*(\d+)/(\d+)\s+(?:\[[=>.]*\]|[━─]+)")
# TensorFlow's start-up noise: absl's pre-init warning and glog-style INFO/WARNING lines
# printed before logging is set up (they ignore TF_CPP_MIN_LOG_LEVEL). Errors stay.
NOISE = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    re.compile(r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\] "),
)


@dataclass(frozen=True)
class Reading:
    """What one line says of a program's progress: the step it reached, or the rate it reports."""

    step: int | None = None
    rate: float | None = None


def check_pattern(pattern: str) -> re.Pattern[str]:
    """A task's own progress pattern: a regular expression with a named group `step` or `rate` (ValueError else)."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"is not a regular expression ({exc})") from None
    if not {"step", "rate"} & set(compiled.groupindex):
        raise ValueError("needs a named group (?P<step>...) or (?P<rate>...)")
    return compiled


class ProgressReader:
    """Reads one program's lines (Keras' epochs are remembered from line to line)."""

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = check_pattern(pattern) if pattern else None
        self.epoch = 1
        self.batches: int | None = None

    def read(self, line: str) -> Reading | None:
        """The progress a line reports, or None; a line that updates itself (`\\r`) counts by its last part."""
        found = None
        for part in line.split("\r"):
            reading = self._read(part)
            if reading is not None:
                found = reading
        return found

    def _read(self, line: str) -> Reading | None:
        line = ANSI.sub("", line)
        if self.pattern is not None:
            match = self.pattern.search(line)
            if match:
                return _from_groups(match)
        match = BOOK_PATTERN.search(line)
        if match:
            return Reading(step=int(match.group(2)))
        match = RATE_PATTERN.search(line)
        if match:
            return Reading(rate=float(match.group(1)))
        match = EPOCH_PATTERN.match(line)
        if match:
            self.epoch = int(match.group(1))
            return None
        match = KERAS_BAR.match(line)
        if match:
            batch, self.batches = int(match.group(1)), int(match.group(2))
            return Reading(step=(self.epoch - 1) * self.batches + batch)
        match = STEP_PATTERN.search(line)
        if match:
            return Reading(step=int(match.group(1)))
        return None


def _from_groups(match: re.Match[str]) -> Reading | None:
    groups = match.groupdict()
    try:
        if groups.get("step") is not None:
            return Reading(step=int(float(groups["step"])))
        if groups.get("rate") is not None:
            return Reading(rate=float(groups["rate"]))
    except ValueError:
        return None
    return None


def step_of(line: str) -> int | None:
    """The step a single line reports (any of the forms above but Keras', which needs the lines before)."""
    reading = ProgressReader().read(line)
    return reading.step if reading is not None else None




def is_noise(line: str) -> bool:
    """Whether a line is TensorFlow's start-up chatter rather than the program's own output."""
    return any(pattern.match(line) for pattern in NOISE)


def node_rate(steps: Sequence[tuple[float, int]], rates: Sequence[tuple[float, float]],
              window_s: float | None = None) -> float | None:
    """Steps per second of one program: from its steps, else the last rate it reported itself."""
    found = rate(steps, window_s)
    if found is not None:
        return found
    if rates and (window_s is None or not steps or rates[-1][0] >= steps[-1][0] - window_s):
        return rates[-1][1]
    return None


def rate(samples: Sequence[tuple[float, int]], window_s: float | None = None) -> float | None:
    """Steps per second from (time, step) samples, over the last `window_s` seconds if given."""
    if window_s is not None and samples:
        samples = [s for s in samples if s[0] >= samples[-1][0] - window_s]
    if len(samples) < 2:
        return None
    (t0, s0), (t1, s1) = samples[0], samples[-1]
    if t1 <= t0 or s1 < s0:
        return None
    return (s1 - s0) / (t1 - t0)


class LineSplitter:
    """Bytes in, whole decoded lines out (the last partial line is kept until more comes).

    With `updates`, a line that rewrites itself (`\\r`, as progress bars do) is handed out at
    each rewrite: what progress is read from, as it happens.
    """

    def __init__(self, updates: bool = False) -> None:
        self.buffer = b""
        self.pattern = re.compile(rb"\r\n|\n|\r") if updates else re.compile(rb"\n")

    def feed(self, chunk: bytes) -> list[str]:
        self.buffer += chunk
        *lines, self.buffer = self.pattern.split(self.buffer)
        return [raw.decode(errors="replace").rstrip("\r") for raw in lines]

    def rest(self) -> list[str]:
        rest, self.buffer = self.buffer, b""
        return [rest.decode(errors="replace").rstrip("\r")] if rest else []
