"""Training progress read from what programs print, as they print it. Pure.

The lines people's programs really print, each giving a step (or a rate):

- `step 300`, `step=5`, TF1's hooks' `loss = 0.1, step = 300`: the program's own step
- `global step 3`, `global_step: 3`: the cluster's (a between-graph trainer's shared counter); a line with
  both, `training step 232 done (global step: 200)`, gives each its own
- the classic books' `After 100 training steps (100 global steps), loss on training batch is 0.71`
- TF1's hooks' `global_step/sec: 123.4` (the cluster's rate, as it is)
- a benchmark's rows, `10  images/sec: 150.7 +/- 4.3 (jitter = 5.1)  7.402` (tf_cnn_benchmarks: its own step)
- Keras' `Epoch 2/5` and then `120/469 [=====>....]`, `120/469 ━━━━━━━━` or `469/469 - 2s - loss: …`
  (step = the batches of the epochs before, and this one's; a fit of one epoch, which prints no `Epoch 1/1`,
  too); tqdm's and Lightning's bars
  (`Epoch 3:  45%|████▌ | 450/1000 [00:05<…]`)
- a custom loop's epochs, where the program says nothing finer: TensorFlow's tutorials' `Epoch: 2, accuracy:
  0.98, train_loss: 0.01.` and `Finished epoch 3, accuracy is 1.0.` (its steps are then its epochs)
- a task's own pattern (tflab.yaml `progress: REGEX`), with a named group `step` or `rate` (other named
  groups are metrics of its quality: plan/quality)

The late-worker rule, the steps/s of the run summary and the cluster metrics all read steps here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

STEP_PATTERN = re.compile(r"\bstep[ =:#]+(\d+)(?![\d.]*\d)", re.IGNORECASE)  # not `step: 0.001`
# `step` after these words names some other step: `max step: 1000`, `Skipping step 5`,
# `Evaluation step: 3 of 100`, `Loss for final step: 0.25.`
NOT_A_STEP = re.compile(r"\b(?:max(?:imum)?|min(?:imum)?|skip(?:ping|ped)?|eval(?:uation)?|final|total|last|"
                        r"first|warm-?up|decay|per|each|every|save[ds]?)[ _]+step\s*$", re.IGNORECASE)
BOOK_PATTERN = re.compile(r"\bAfter (\d+) training steps? \((\d+) global steps?\)", re.IGNORECASE)
GLOBAL_STEP = re.compile(r"\bglobal[ _]step[ =:#(]+(\d+)(?![\d.]*\d)", re.IGNORECASE)
IMAGES_ROW = re.compile(r"^\s*(\d+)\s+(?:images|examples|sentences|tokens)/sec:\s*[0-9.]+")
RATE_PATTERN = re.compile(r"\bglobal_step/sec: ([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)")
EPOCH_PATTERN = re.compile(r"^\s*Epoch (\d+)/(\d+)\s*$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # Keras 3 colours its bar even into a pipe
# Keras' batch counter: a bar (verbose=1), or `469/469 - 2s - loss: …` (verbose=2), the total
# `Unknown` while the first epoch of a dataset of unknown length runs.
KERAS_BAR = re.compile(r"^\s*(\d+)/(\d+|Unknown)\s+(?:\[[=>.]*\]|[━─]+|-\s+\d)")
# An epoch a custom loop reports done (TensorFlow's distributed tutorials: `Epoch: 2, accuracy: 0.98, ...`,
# `Finished epoch 3, accuracy is 1.0.`): the progress of a program that says nothing finer.
EPOCH_DONE = re.compile(r"^\s*(?:Finished epoch|Epoch:)\s+(\d+)\s*[,.]", re.IGNORECASE)
# Keras' line at the end of a training epoch (verbose=2): Keras prints no `Epoch 1/1` before a fit of one epoch.
EPOCH_END = re.compile(r"\d+(?:\.\d+)?m?s/epoch\b")
# tqdm's bars, and PyTorch Lightning's (`Epoch 3:  45%|████▌     | 450/1000 [00:05<00:06, 90.0it/s]`)
TQDM_BAR = re.compile(r"^\s*(?:Epoch (\d+):)?.*?\|\s*(\d+)/(\d+|\?)\s*\[")


def cpp_record(levels: str) -> re.Pattern[str]:
    """A record TensorFlow's C++ side logs at one of `levels` (`IWEF`): glog's `I1124 21:59:01.1 123 file.cc:14] `,
    or the older `2024-11-24 21:59:01.123456: I tensorflow/…/file.cc:14] `. Only C/C++ source names:
    a Python program's own absl records (`prog.py:14]`) are its output."""
    source = r"[\w./+-]+\.(?:cc|c|cpp|cxx|h|hpp):\d+\] "
    return re.compile(rf"^(?:[{levels}]\d{{4}} \d\d:\d\d:\d+\.\d+\s+\d+ |"
                      rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [{levels}] ){source}")


# TensorFlow's start-up noise: absl's pre-init warning and the C++ side's INFO/WARNING records
# (printed whatever TF_CPP_MIN_LOG_LEVEL says, before logging is set up). Errors stay.
NOISE = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"),
    cpp_record("IW"),
)
ERROR_RECORD = cpp_record("EF")  # an error TensorFlow's C++ side logged (shown; no program's result)
# The lines gRPC adds under such an error ("Additional GRPC error information from remote target ...",
# ":UNKNOWN:Error received from peer {grpc_status:14, ...}"): part of the record, no program's result either.
ERROR_DETAIL = re.compile(r"^(?:Additional GRPC error information from remote target |:?\w+:Error received from peer )")
# A MultiWorkerMirroredStrategy worker's runtime calling the coordination service its leader (the chief,
# task 0) ran, after that leader is gone: logged by a worker that outlives the chief, in its teardown.
LEADER_GONE = re.compile(r"Failed to send RPC to coordination service|/tensorflow\.CoordinationService/Heartbeat")


def tensorflow_error(line: str) -> bool:
    """Whether a line is an error TensorFlow's runtime logged (or gRPC's detail under one): shown, no result."""
    return bool(ERROR_RECORD.match(line) or ERROR_DETAIL.match(line))


@dataclass(frozen=True)
class Reading:
    """What one line says of a program's progress: its own step or rate, and the cluster's (the global step)."""

    step: int | None = None
    rate: float | None = None
    global_step: int | None = None
    global_rate: float | None = None


def check_pattern(pattern: str) -> re.Pattern[str]:
    """A task's own progress pattern: a regular expression with a named group `step` or `rate`, or one that names a
    metric of its quality (`quality`, `f1`: plan/quality) (ValueError else)."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"is not a regular expression ({exc})") from None
    if not compiled.groupindex:
        raise ValueError("needs a named group (?P<step>...) or (?P<rate>...), or one for a metric: (?P<quality>...)")
    return compiled


class ProgressReader:
    """Reads one program's lines (Keras' epochs are remembered from line to line)."""

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = check_pattern(pattern) if pattern else None
        self.epoch = 1
        self.batches: int | None = None  # batches per epoch, once a counter said
        self.epoch_of_batches = 0
        self.seen_epoch = False
        self.last_batch_step = 0
        self.finer = False  # a step was read from something finer than a custom loop's epoch lines

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
        match = EPOCH_DONE.match(line)
        if match:  # its epochs count only while nothing finer does
            return None if self.finer else Reading(step=int(match.group(1)))
        reading = self._read_steps(line)
        if reading is not None:
            self.finer = True
        return reading

    def _read_steps(self, line: str) -> Reading | None:
        if self.pattern is not None:
            match = self.pattern.search(line)
            reading = _from_groups(match) if match else None
            if reading is not None:
                return reading
        match = BOOK_PATTERN.search(line)
        if match:
            return Reading(step=int(match.group(1)), global_step=int(match.group(2)))
        match = RATE_PATTERN.search(line)
        if match:
            return Reading(global_rate=float(match.group(1)))
        match = IMAGES_ROW.match(line)
        if match:
            return Reading(step=int(match.group(1)))
        found = GLOBAL_STEP.search(line)
        if found:  # the cluster's step; the program's own where the line says it too
            rest = line[:found.start()] + " " + line[found.end():]
            own = next((int(m.group(1)) for m in STEP_PATTERN.finditer(rest)
                        if not NOT_A_STEP.search(rest[:m.start() + 4])), None)
            return Reading(step=own, global_step=int(found.group(1)))
        match = EPOCH_PATTERN.match(line)
        if match:
            self.epoch, self.seen_epoch = int(match.group(1)), True
            return None
        match = KERAS_BAR.match(line)
        if match:  # a fit of one epoch prints no `Epoch 1/1`: its counter counts; `evaluate` after it goes back
            return self._batch(int(match.group(1)), match.group(2))
        match = TQDM_BAR.match(line)
        if match:
            if match.group(1) is not None:  # Lightning counts its epochs from 0
                self.epoch = int(match.group(1)) + 1
            return self._batch(int(match.group(2)), match.group(3))
        for match in STEP_PATTERN.finditer(line):
            if not NOT_A_STEP.search(line[:match.start() + 4]):
                return Reading(step=int(match.group(1)))
        return None

    def _batch(self, batch: int, total: str) -> Reading | None:
        """A batch counter's step: the batches of the epochs before, and this one's.

        A counter that would go back (Keras' `evaluate` after `fit`, a validation bar) is not training.
        """
        if total.isdecimal():
            if self.batches is None or self.epoch_of_batches != self.epoch:
                self.batches, self.epoch_of_batches = int(total), self.epoch
            elif int(total) != self.batches:
                return None  # another loop's bar within this epoch
        step = (self.epoch - 1) * (self.batches or 0) + batch
        if step < self.last_batch_step:
            return None
        self.last_batch_step = step
        return Reading(step=step)


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


def steady_rate(samples: Sequence[tuple[float, int]], skip: float = 0.2) -> float | None:
    """Steps per second once training settled: the median of the rates over the steps after the first `skip`.

    The kept span is cut in (up to) five equal stretches of steps, each one's rate taken; their
    median is robust to a program that prints its steps in bursts and to one slow stretch.
    """
    if len(samples) < 3:
        return rate(samples)
    first, last = samples[0][1], samples[-1][1]
    kept = [s for s in samples if s[1] >= first + (last - first) * skip]
    if len(kept) < 2:
        return rate(samples)
    pieces = min(5, len(kept) - 1)
    bounds = [round(j * (len(kept) - 1) / pieces) for j in range(pieces + 1)]
    rates = []
    for start, end in zip(bounds, bounds[1:]):
        (t0, s0), (t1, s1) = kept[start], kept[end]
        if t1 > t0 and s1 >= s0:
            rates.append((s1 - s0) / (t1 - t0))
    if not rates:
        return rate(kept)
    rates.sort()
    middle = len(rates) // 2
    return rates[middle] if len(rates) % 2 else (rates[middle - 1] + rates[middle]) / 2


def displayed(line: str) -> str:
    """A line as a terminal leaves it: each `\r` starts it over, each `\b` takes the character before it back (a
    progress bar's redraws, Keras' and tqdm's); the last state, not the enormous line of every redraw."""
    parts = line.split("\r")
    shown = next((part for part in reversed(parts) if part.strip()), parts[-1])
    if "\b" not in shown:
        return shown
    out: list[str] = []
    for char in shown:
        if char == "\b":
            if out:
                out.pop()
        else:
            out.append(char)
    return "".join(out)


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

    def pending(self) -> str:
        """The line being written, not ended yet (a bar that redraws itself with `\r`)."""
        return self.buffer.decode(errors="replace")

    def rest(self) -> list[str]:
        rest, self.buffer = self.buffer, b""
        return [rest.decode(errors="replace").rstrip("\r")] if rest else []
