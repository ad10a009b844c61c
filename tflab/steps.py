"""Training progress read from what programs print: `step N` lines and the rate they imply."""

from __future__ import annotations

import re
from collections.abc import Sequence

STEP_PATTERN = re.compile(r"\bstep[ =:#]+(\d+)", re.IGNORECASE)
# TensorFlow's start-up noise: absl's pre-init warning and glog-style INFO/WARNING lines
# printed before logging is set up (they ignore TF_CPP_MIN_LOG_LEVEL). Errors stay.
NOISE = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    re.compile(r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\] "),
)


def step_of(line: str) -> int | None:
    """The step number a line reports (`step 120`, `global step 3`, `step=5`), or None."""
    match = STEP_PATTERN.search(line)
    return int(match.group(1)) if match else None


def is_noise(line: str) -> bool:
    """Whether a line is TensorFlow's start-up chatter rather than the program's own output."""
    return any(pattern.match(line) for pattern in NOISE)


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
    """Bytes in, whole decoded lines out (the last partial line is kept until more comes)."""

    def __init__(self) -> None:
        self.buffer = b""

    def feed(self, chunk: bytes) -> list[str]:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [raw.decode(errors="replace").rstrip("\r") for raw in lines]

    def rest(self) -> list[str]:
        rest, self.buffer = self.buffer, b""
        return [rest.decode(errors="replace").rstrip("\r")] if rest else []
