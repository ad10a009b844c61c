"""The standard cost model of data-parallel training, fitted to a sweep over workers, to look past it.

A step takes its compute time, the latency of its messages and its bytes over the link (the
alpha-beta model of Hockney, used by Paleo and Optimus):

- parameter servers, asynchronous: a worker's step is one round trip to the servers, whose link
  its N peers share: `t = c + β·N/B`, and the cluster makes `N / t` (global) steps per second;
- ring all-reduce, synchronous: a step is 2(N−1) message rounds, each worker sending
  `2(N−1)/N` of the model: `t = c + α·2(N−1) + β·(2(N−1)/N)/B`, the cluster `1 / t` steps/s.

`B` is the link's rate as shaped (Mbit/s); `c` (compute seconds per step), `α` (seconds per
message round) and `β` (seconds·Mbit/s per step: the model's megabits) are fitted by least
squares over every measured point of the sweep together, each with its own link rate, none
negative. The error is leave-one-out: each measured point predicted by a fit without it. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PS = "parameter servers"
ALLREDUCE = "all-reduce"
FORMULAS = {PS: "t = c + β·N/B; steps/s = N / t",
            ALLREDUCE: "t = c + α·2(N−1) + β·(2(N−1)/N)/B; steps/s = 1 / t"}
PARAMETERS = {PS: ("c", "β"), ALLREDUCE: ("c", "α", "β")}
UNSHAPED_MBIT = 1.0  # a sweep with no shaped link at all fits β/B as one constant


def features(strategy: str, workers: int, link_mbit: float) -> list[float]:
    """The terms the constants multiply, for one point."""
    if strategy == PS:
        return [1.0, workers / link_mbit]
    return [1.0, 2.0 * (workers - 1), 2.0 * (workers - 1) / workers / link_mbit]


def step_time(strategy: str, workers: int, rate: float) -> float:
    """The model's `t` from a cluster's measured steps per second."""
    return workers / rate if strategy == PS else 1.0 / rate


def rate_from(strategy: str, workers: int, t: float) -> float:
    return (workers if strategy == PS else 1.0) / t


def _solve(rows: Sequence[Sequence[float]], targets: Sequence[float]) -> list[float] | None:
    """Least squares with every constant at least 0 (a term that would go negative is left out, and refitted)."""
    import numpy as np

    free = list(range(len(rows[0])))
    while free:
        matrix = np.array([[row[i] for i in free] for row in rows])
        if len(rows) < len(free) or np.linalg.matrix_rank(matrix) < len(free):
            # too few points, or a term that does not vary: leave the last one out
            free = free[:-1]
            continue
        solution, *_ = np.linalg.lstsq(matrix, np.array(targets), rcond=None)
        worst = min(range(len(free)), key=lambda i: solution[i])
        if solution[worst] < 0 and len(free) > 1:
            free.pop(worst)
            continue
        constants = [0.0] * len(rows[0])
        for i, value in zip(free, solution):
            constants[i] = max(float(value), 0.0)
        return constants if constants[0] > 0 else None
    return None


@dataclass(frozen=True)
class Point:
    workers: int
    link_mbit: float
    rate: float  # measured steps/s (mean over repeats)


@dataclass(frozen=True)
class Fit:
    """The fitted model: its constants, the measured points it was fitted to, and each one's leave-one-out error."""

    strategy: str
    constants: tuple[float, ...]
    points: tuple[Point, ...]
    errors: Mapping[tuple[int, float], float]  # (workers, link) -> |predicted - measured| / measured

    @property
    def error(self) -> float | None:
        """The mean leave-one-out error (None where no point could be left out and still fitted)."""
        return sum(self.errors.values()) / len(self.errors) if self.errors else None

    def predict(self, workers: int, link_mbit: float) -> float:
        t = sum(a * b for a, b in zip(self.constants, features(self.strategy, workers, link_mbit)))
        return rate_from(self.strategy, workers, t)

    def describe(self) -> str:
        names = PARAMETERS[self.strategy]
        units = {"c": "s", "α": "s", "β": "s·Mbit/s"}
        return ", ".join(f"{n} = {v:.4g} {units[n]}" for n, v in zip(names, self.constants))


def _fit_constants(strategy: str, points: Sequence[Point]) -> list[float] | None:
    if not points:
        return None
    rows = [features(strategy, p.workers, p.link_mbit) for p in points]
    return _solve(rows, [step_time(strategy, p.workers, p.rate) for p in points])


def fit(strategy: str, samples: Sequence[tuple[int, float, float | None]]) -> Fit | None:
    """The model fitted to (workers, steps/s, link Mbit/s or None) samples, repeats averaged.

    Unshaped samples count only where no sample is shaped (then the link is one unknown).
    None where fewer than two worker counts were measured.
    """
    shaped = any(link for _, _, link in samples)
    grouped: dict[tuple[int, float], list[float]] = {}
    for workers, rate, link in samples:
        if not rate or rate <= 0 or workers <= 0 or (shaped and not link):
            continue
        grouped.setdefault((workers, float(link) if link else UNSHAPED_MBIT), []).append(rate)
    points = tuple(Point(n, link, sum(r) / len(r)) for (n, link), r in sorted(grouped.items()))
    if len({p.workers for p in points}) < 2:
        return None
    constants = _fit_constants(strategy, points)
    if constants is None:
        return None
    errors: dict[tuple[int, float], float] = {}
    if len(points) > len(PARAMETERS[strategy]):
        for left_out in points:
            rest = [p for p in points if p is not left_out]
            others = _fit_constants(strategy, rest)
            if others is not None and len({p.workers for p in rest}) >= 2:
                partial = Fit(strategy, tuple(others), tuple(rest), {})
                errors[(left_out.workers, left_out.link_mbit)] = \
                    abs(partial.predict(left_out.workers, left_out.link_mbit) - left_out.rate) / left_out.rate
    return Fit(strategy, tuple(constants), points, errors)
