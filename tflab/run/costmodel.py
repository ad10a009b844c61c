"""The cost model of data-parallel training, with the CPUs in it, fitted to a sweep to look past it.

A step's time has the terms the runs measure (the alpha-beta model of Hockney, used by Paleo
and Optimus, with the CPU shares each point ran with). What happens one after another adds up;
what happens at once overlaps, the slowest setting the pace (a smooth maximum: the p-norm with
p = 4, so two terms that meet cost a little more than one):

- parameter servers, asynchronous: a round trip `a`, then, at once, the worker's compute on its
  CPU share `c/s_w`, the servers' CPU work for every worker they serve `κ·N/s_ps`, and its bytes
  over the servers' link, shared by its N peers, `β·N/B`; the cluster makes `N / t` steps/s;
- ring all-reduce, synchronous: the compute `c/s_w`, a barrier with its peers `b` (N > 1), and
  2(N−1) message rounds `α·2(N−1)`, then, at once, the reduction's CPU work on the `2(N−1)/N` of
  the model each worker sums `κ·(2(N−1)/N)/s_w` and those bytes over the link `β·(2(N−1)/N)/B`;
  the cluster makes `1 / t` steps/s.

`B` is the link's rate as shaped (Mbit/s), shares in CPUs. The constants are fitted with
SciPy's bounded least squares (`least_squares`, every constant at least 0) to every measured
point at once, each with its own link and shares, on relative errors. Which terms the points
can tell apart is chosen by AICc (the compute always kept): a term the sweep did not vary, or
that does not earn its constant, is left out (its time folds into the others). The error is
leave-one-out: each measured point predicted by a fit (of the same terms) without it. A
prediction says which term dominates it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

PS = "parameter servers"
ALLREDUCE = "all-reduce"
OVERLAP_P = 4.0
FORMULAS = {PS: "t = a + ‖c/s_w, κ·N/s_ps, β·N/B‖₄; steps/s = N / t",
            ALLREDUCE: "t = c/s_w + b·[N>1] + α·2(N−1) + ‖κ·(2(N−1)/N)/s_w, β·(2(N−1)/N)/B‖₄; steps/s = 1 / t"}
# Each term: (its constant's name, what dominates when it is the largest, whether it overlaps the others).
TERMS = {PS: (("c", "worker-cpu", True), ("a", "latency", False), ("κ", "ps-cpu", True), ("β", "link", True)),
         ALLREDUCE: (("c", "worker-cpu", False), ("b", "barrier", False), ("α", "latency", False),
                     ("κ", "reduce-cpu", True), ("β", "link", True))}
UNITS = {"c": "CPU·s", "a": "s", "b": "s", "α": "s", "κ": "CPU·s", "β": "s·Mbit/s"}
UNSHAPED_MBIT = 1.0  # a sweep with no shaped link at all fits β/B as one constant
ALWAYS_WHEN_MEASURED = ("ps-cpu",)  # a term kept whenever a run measured its limit


@dataclass(frozen=True)
class Point:
    """One measured design: its workers, link (Mbit/s), the CPUs of a worker and of a server, its steps/s."""

    workers: int
    link_mbit: float
    rate: float  # measured steps/s (the mean over repeats)
    worker_cpus: float = 1.0
    ps_cpus: float = 1.0

    @property
    def key(self) -> tuple[int, float, float, float]:
        return (self.workers, self.link_mbit, self.worker_cpus, self.ps_cpus)


def features(strategy: str, point: Point) -> list[float]:
    """What each constant multiplies, for one design."""
    n, link, s_w, s_ps = point.workers, point.link_mbit, point.worker_cpus, point.ps_cpus
    if strategy == PS:
        return [1.0 / s_w, 1.0, n / s_ps, n / link]
    rounds = 2.0 * (n - 1)
    return [1.0 / s_w, 1.0 if n > 1 else 0.0, rounds, rounds / n / s_w, rounds / n / link]


def combine(strategy: str, terms: Sequence[float]) -> float:
    """A step's time from its terms' times: the serial ones added, the overlapping ones' smooth maximum."""
    serial = sum(t for t, (_, _, overlaps) in zip(terms, TERMS[strategy]) if not overlaps)
    together = [t for t, (_, _, overlaps) in zip(terms, TERMS[strategy]) if overlaps]
    return serial + sum(t ** OVERLAP_P for t in together) ** (1.0 / OVERLAP_P)


def step_time(strategy: str, workers: int, rate: float) -> float:
    """The model's `t` from a cluster's measured steps per second."""
    return workers / rate if strategy == PS else 1.0 / rate


def rate_from(strategy: str, workers: int, t: float) -> float:
    return (workers if strategy == PS else 1.0) / t


def _solve(strategy: str, points: Sequence[Point], kept: Sequence[int]) -> tuple[list[float], float] | None:
    """The constants of the terms `kept` (the others 0) that fit `points` best in relative terms, and the sum of
    the squared relative errors: SciPy's bounded least squares, from a few starts."""
    import numpy as np
    from scipy.optimize import least_squares

    rows = [features(strategy, p) for p in points]
    targets = [step_time(strategy, p.workers, p.rate) for p in points]
    size = len(TERMS[strategy])

    def constants_of(values: Sequence[float]) -> list[float]:
        constants = [0.0] * size
        for i, value in zip(kept, values):
            constants[i] = float(value)
        return constants

    def residuals(values: Sequence[float]) -> list[float]:
        constants = constants_of(values)
        return [combine(strategy, [c * f for c, f in zip(constants, row)]) / t - 1.0 for row, t in zip(rows, targets)]

    best = None
    for start in (1e-3, 1e-2, 1e-1):
        found = least_squares(residuals, np.full(len(kept), start), bounds=(0.0, np.inf))
        if best is None or found.cost < best.cost:
            best = found
    if best is None or not np.all(np.isfinite(best.x)):
        return None
    return constants_of(best.x), 2.0 * float(best.cost)


def _varying(strategy: str, points: Sequence[Point]) -> list[int]:
    """The terms whose factor is not 0 everywhere (the others can hold no time here)."""
    rows = [features(strategy, p) for p in points]
    return [i for i in range(len(TERMS[strategy])) if any(row[i] for row in rows)]


def choose_terms(strategy: str, points: Sequence[Point], measured: Sequence[str] = ()) -> list[int]:
    """The terms the points support, by AICc: the compute always in, and the servers' CPU where the runs measured
    it at its limit (`measured`: a sweep's limits; a cgroup's throttling counts that one directly, where a busy
    link may be a symptom); of the others, the fewest that fit them well."""
    n = len(points)
    varying = _varying(strategy, points)
    required = [0] + [i for i in varying if i != 0 and TERMS[strategy][i][1] in measured
                      and TERMS[strategy][i][1] in ALWAYS_WHEN_MEASURED]
    optional = [i for i in varying if i not in required]
    best: tuple[float, list[int]] | None = None
    for size in range(len(optional) + 1):
        for extra in itertools.combinations(optional, size):
            kept = sorted([*required, *extra])
            k = len(kept)
            # AICc needs two points more than terms; where the terms the runs measured leave less room than that
            # (a sweep of four points, a held-out one), a term more than AICc allows is judged by AIC
            if k >= n or (n - k - 1 <= 0 and len(required) < n - 2):
                continue
            solved = _solve(strategy, points, kept)
            if solved is None:
                continue
            small = 2 * k * (k + 1) / (n - k - 1) if n - k - 1 > 0 else 0.0
            score = n * math.log(max(solved[1], 1e-12) / n) + 2 * k + small
            if best is None or score < best[0] - 1e-9:
                best = (score, kept)
    return best[1] if best else required


@dataclass(frozen=True)
class Fit:
    """The fitted model: its constants, the measured points it was fitted to, and each one's leave-one-out error."""

    strategy: str
    constants: tuple[float, ...]
    points: tuple[Point, ...]
    errors: Mapping[tuple[int, float, float, float], float] = field(default_factory=dict)  # key -> relative error

    @property
    def error(self) -> float | None:
        """The mean leave-one-out error (None where no point could be left out and still fitted)."""
        return sum(self.errors.values()) / len(self.errors) if self.errors else None

    def terms(self, point: Point) -> dict[str, float]:
        """Each term's seconds of the step's time at `point`, by what it stands for (worker-cpu, link, ...)."""
        return {what: constant * value for (_, what, _), constant, value
                in zip(TERMS[self.strategy], self.constants, features(self.strategy, point))}

    def predict(self, workers: int, link_mbit: float, worker_cpus: float = 1.0, ps_cpus: float = 1.0) -> float:
        t = combine(self.strategy, list(self.terms(Point(workers, link_mbit, 0.0, worker_cpus, ps_cpus)).values()))
        return rate_from(self.strategy, workers, t)

    def dominant(self, workers: int, link_mbit: float, worker_cpus: float = 1.0, ps_cpus: float = 1.0) -> str:
        """What takes the largest part of a step at that design."""
        terms = self.terms(Point(workers, link_mbit, 0.0, worker_cpus, ps_cpus))
        return max(terms, key=lambda what: terms[what])

    def describe(self) -> str:
        return ", ".join(f"{name} = {value:.4g} {UNITS[name]}" for (name, _, _), value
                         in zip(TERMS[self.strategy], self.constants) if value)

    def as_dict(self) -> dict[str, object]:
        """model.json."""
        return {"strategy": self.strategy, "formula": FORMULAS[self.strategy],
                "constants": {name: value for (name, _, _), value in zip(TERMS[self.strategy], self.constants)},
                "units": {name: UNITS[name] for name, _, _ in TERMS[self.strategy]},
                "leave_one_out_error": self.error,
                "points": [{"workers": p.workers, "link_mbit": p.link_mbit, "worker_cpus": p.worker_cpus,
                            "ps_cpus": p.ps_cpus, "steps_per_s": p.rate,
                            "error": self.errors.get(p.key)} for p in self.points]}


def fit(strategy: str, samples: Sequence[tuple[int, float, float | None]] | Sequence[Point],
        measured: Sequence[str] = ()) -> Fit | None:
    """The model fitted to measured designs: Points, or (workers, steps/s, link Mbit/s or None) samples of one
    CPU share; repeats averaged. `measured`: the limits the runs found (their terms are kept).

    Unshaped samples count only where no sample is shaped (then the link is one unknown).
    None where fewer than two worker counts were measured.
    """
    given = [s if isinstance(s, Point) else Point(s[0], float(s[2]) if s[2] else 0.0, s[1]) for s in samples]
    shaped = any(p.link_mbit for p in given)
    grouped: dict[tuple[int, float, float, float], list[float]] = {}
    for p in given:
        if not p.rate or p.rate <= 0 or p.workers <= 0 or p.worker_cpus <= 0 or p.ps_cpus <= 0 \
                or (shaped and not p.link_mbit):
            continue
        link = p.link_mbit if p.link_mbit else UNSHAPED_MBIT
        grouped.setdefault((p.workers, link, p.worker_cpus, p.ps_cpus), []).append(p.rate)
    points = tuple(Point(n, link, sum(r) / len(r), s_w, s_ps) for (n, link, s_w, s_ps), r in sorted(grouped.items()))
    if len({p.workers for p in points}) < 2:
        return None
    kept = choose_terms(strategy, points, measured)
    solved = _solve(strategy, points, kept)
    if solved is None:
        return None
    errors: dict[tuple[int, float, float, float], float] = {}
    if len(points) > len(kept):
        for left_out in points:
            rest = [p for p in points if p is not left_out]
            others = _solve(strategy, rest, kept)
            if others is not None and len({p.workers for p in rest}) >= 2:
                partial = Fit(strategy, tuple(others[0]), tuple(rest))
                predicted = partial.predict(left_out.workers, left_out.link_mbit, left_out.worker_cpus,
                                            left_out.ps_cpus)
                errors[left_out.key] = abs(predicted - left_out.rate) / left_out.rate
    return Fit(strategy, tuple(solved[0]), points, errors)
