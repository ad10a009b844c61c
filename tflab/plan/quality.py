"""A run's quality as its programs print it, read as numbers: accuracy and loss, named as printed. Pure.

The lines programs really print:

- the examples' `worker0: test accuracy 0.9722`, `global step 300 loss 0.0265 accuracy 0.91`
- Keras' `accuracy: 0.9531 - loss: 0.1234 - val_accuracy: 0.95 - val_loss: 0.15` (`acc` read as accuracy)
- TF1 hooks' `loss = 0.1, step = 300`
- TensorFlow's tutorials' `Finished epoch 3, accuracy is 1.000000.`
- a task's own progress pattern (tflab.yaml `progress: REGEX`): a named group `quality`, or a group named
  for its metric (`(?P<f1>...)`), besides `step` and `rate`

Time to a target (`time_to`) reads the first time a metric reached it: at least the target for an
accuracy-like metric, at most for a loss.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

NUMBER = r"([-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)"
TEST_ACCURACY = re.compile(r"\btest[ _]accuracy\s*[:=]?\s*" + NUMBER, re.IGNORECASE)
NAMED = re.compile(r"(?<![\w.])(val_accuracy|val_acc|val_loss|accuracy|acc|loss)\s*(?:[:=]\s*|\s+(?:is\s+)?)" + NUMBER)
ALIASES = {"acc": "accuracy", "val_acc": "val_accuracy"}
OWN_GROUPS_IGNORED = ("step", "rate")
LOWER_IS_BETTER = ("loss", "error", "perplexity", "mse", "mae")
MAX_SERIES = 400  # points kept per metric in run.json (every other one dropped as it grows)


def read(line: str, own: re.Pattern[str] | None = None) -> dict[str, float]:
    """The metrics a line prints, by name; {} for a line that prints none."""
    found: dict[str, float] = {}
    if own is not None:
        match = own.search(line)
        if match:
            for name, value in match.groupdict().items():
                if name not in OWN_GROUPS_IGNORED and value is not None:
                    number = _number(value)
                    if number is not None:
                        found[name] = number
    test = TEST_ACCURACY.search(line)
    if test:
        number = _number(test.group(1))
        if number is not None:
            found["accuracy"] = number
    for name, value in NAMED.findall(line):
        number = _number(value)
        if number is not None:
            found.setdefault(ALIASES.get(name, name), number)
    return found


def _number(text: str) -> float | None:
    try:
        value = float(text.rstrip("."))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def lower_is_better(name: str) -> bool:
    return any(word in name.lower() for word in LOWER_IS_BETTER)


def time_to(series: Sequence[Sequence[float]], name: str, target: float) -> float | None:
    """The first time (of `series`' [t, value] pairs) `name` reached `target`; None when it never did."""
    for t, value in series:
        if (value <= target) if lower_is_better(name) else (value >= target):
            return float(t)
    return None


def parse_target(text: str) -> tuple[str, float]:
    """`accuracy=0.95`: (name, value); a ValueError naming what is wrong otherwise."""
    name, sep, value = text.partition("=")
    number = _number(value.strip()) if sep else None
    if not name.strip() or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name.strip()) or number is None:
        raise ValueError(f"{text!r} is not METRIC=VALUE (such as accuracy=0.95 or loss=0.1)")
    return name.strip(), number


def thin(series: list[list[float]]) -> list[list[float]]:
    """A series kept under MAX_SERIES points: every other point dropped, the last one kept."""
    if len(series) <= MAX_SERIES:
        return series
    return series[:-1:2] + [series[-1]]
