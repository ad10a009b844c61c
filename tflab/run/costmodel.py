"""The standard cost model of data-parallel training, fitted to a sweep over workers, to look past it.

A step of one worker takes its compute time plus the time its bytes take over the link
(Paleo, Optimus and their kind):

- parameter servers, asynchronous: every worker's pull and push cross the servers' links, which
  N workers share, so a worker's step takes `c + k·N` and the cluster makes `N / (c + k·N)`
  steps per second;
- ring all-reduce, synchronous: each worker sends and receives `2(N−1)/N` of the model per
  step, so a step takes `c + k·2(N−1)/N` and the cluster makes `1 / (c + k·2(N−1)/N)` per second.

`c` (seconds of compute per step) and `k` (seconds per step the link costs per unit above, the
model's bytes over the link's rate) are fitted by least squares on the measured points, one fit
per link rate; the fit's error is taken leave-one-out (each measured point predicted from the
others). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PS = "parameter servers"
ALLREDUCE = "all-reduce"
FORMULAS = {PS: "steps/s = N / (c + k·N)", ALLREDUCE: "steps/s = 1 / (c + k·2(N−1)/N)"}


def traffic(strategy: str, workers: int) -> float:
    """The link's share of one step, in the model's units: N for parameter servers, 2(N−1)/N for a ring."""
    return float(workers) if strategy == PS else 2.0 * (workers - 1) / workers


def per_step(strategy: str, workers: int, rate: float) -> float:
    """Seconds one step of the model's unit takes, from a cluster's measured steps per second."""
    return workers / rate if strategy == PS else 1.0 / rate


def predict_rate(strategy: str, workers: int, c: float, k: float) -> float:
    step = c + k * traffic(strategy, workers)
    return (workers if strategy == PS else 1.0) / step


@dataclass(frozen=True)
class Fit:
    """A fitted model for one link: its constants, the measured points, and its leave-one-out error."""

    strategy: str
    c: float
    k: float
    measured: Mapping[int, float]  # workers -> mean steps/s over repeats
    errors: Mapping[int, float]  # workers -> |predicted - measured| / measured, leaving that point out

    @property
    def error(self) -> float | None:
        """The mean leave-one-out error (None with fewer than three measured points: nothing to leave out)."""
        return sum(self.errors.values()) / len(self.errors) if self.errors else None

    def predict(self, workers: int) -> float:
        return predict_rate(self.strategy, workers, self.c, self.k)


def _least_squares(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(intercept, slope) of y on x; None when the x's do not vary."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    # A step cannot take negative time: a fit that says so is clamped to the nearest sensible one.
    slope = max(slope, 0.0)
    intercept = max(my - slope * mx, 1e-9)
    return intercept, slope


def _fit_points(strategy: str, measured: Mapping[int, float]) -> tuple[float, float] | None:
    pairs = [(traffic(strategy, n), per_step(strategy, n, rate)) for n, rate in measured.items() if rate > 0]
    if len(pairs) < 2:
        return None
    return _least_squares(pairs)


def fit(strategy: str, samples: Sequence[tuple[int, float]]) -> Fit | None:
    """The model fitted to (workers, steps/s) samples (repeats averaged); None with fewer than two worker counts."""
    by_workers: dict[int, list[float]] = {}
    for workers, rate in samples:
        if rate and rate > 0 and workers > 0:
            by_workers.setdefault(workers, []).append(rate)
    measured = {n: sum(r) / len(r) for n, r in sorted(by_workers.items())}
    constants = _fit_points(strategy, measured)
    if constants is None:
        return None
    errors: dict[int, float] = {}
    if len(measured) >= 3:
        for left_out, actual in measured.items():
            rest = {n: r for n, r in measured.items() if n != left_out}
            others = _fit_points(strategy, rest)
            if others is not None:
                errors[left_out] = abs(predict_rate(strategy, left_out, *others) - actual) / actual
    return Fit(strategy, constants[0], constants[1], measured, errors)
