"""A sweep: a grid of run-time knobs, each point a normal run of the running lab, one row of results each.

`tflab sweep TASK --vary workers=1,2,3 --vary link-rate=100mbit,1gbit --repeats 2` runs every
point of the grid (repeats included) one after another. What a sweep is (its task, axes,
repeats) is kept in `runs/sweeps/NAME/sweep.json`, its rows in `results.json` and `results.csv`
as each point finishes, so `--resume NAME` runs only the points without a row. Each point's run
folder is kept under the sweep (`runs/sweeps/NAME/runs/POINT/`).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tflab.errors import UserError
from tflab.plan import knobs as knob_rules
from tflab.plan import links, quality
from tflab.plan.config import LabConfig, check_task_name
from tflab.plan.knobs import Knobs
from tflab.plan.topology import Lab
from tflab.run.runreport import RunReport

SWEEPS_DIR = "sweeps"
SPEC_FILE = "sweep.json"
RESULTS_JSON = "results.json"
RESULTS_CSV = "results.csv"
POINT_RUNS = "runs"
AXES = ("workers", "link-rate", "cpus", "task")
ENV_AXIS = "env."
MAX_POINTS = 1000
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
# The columns every row has, before the per-node ones (DESIGN.md, Experiments).
COLUMNS = ("repeat", "verdict", "steps_per_s", "examples_per_s", "first_step_s", "limit", "worker_cpus", "ps_cpus",
           "run")
PREDICT_AXES = ("workers", "link-rate", "cpus", "ps.cpus")  # what the cost model predicts along
QUALITY_COLUMNS = ("accuracy", "loss")  # as the chief printed them last (plan/quality); others follow when printed
TARGET_COLUMN = "time_to_target_s"


@dataclass(frozen=True)
class Axis:
    """One knob the sweep varies, and its values as written on the command line."""

    name: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class Point:
    """One run of the grid: a value per axis, and which repeat it is."""

    number: int  # 1-based, in grid order
    values: Mapping[str, str]
    repeat: int

    @property
    def key(self) -> str:
        """The point's folder name and identity in the results."""
        return f"p{self.number:03d}"

    def describe(self) -> str:
        return ", ".join(f"{axis}={value}" for axis, value in self.values.items())


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep is: kept in sweep.json so `--resume` runs the same grid."""

    name: str
    task: str | None
    axes: tuple[Axis, ...]
    repeats: int = 1
    predict: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    target: tuple[str, float] | None = None  # --target accuracy=0.95: each point's time to reach it
    holdout: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # points measured, left out of the fit

    def points(self) -> list[Point]:
        grid = itertools.product(*(axis.values for axis in self.axes)) if self.axes else [()]
        points: list[Point] = []
        for combo in grid:
            for repeat in range(1, self.repeats + 1):
                values = {axis.name: value for axis, value in zip(self.axes, combo)}
                points.append(Point(len(points) + 1, values, repeat))
        return points

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "task": self.task, "repeats": self.repeats,
                "axes": [{"name": a.name, "values": list(a.values)} for a in self.axes],
                "predict": {k: list(v) for k, v in self.predict.items()},
                "target": list(self.target) if self.target else None,
                "holdout": {k: list(v) for k, v in self.holdout.items()}}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> SweepSpec:
        try:
            return SweepSpec(str(data["name"]), data.get("task"),
                             tuple(Axis(str(a["name"]), tuple(str(v) for v in a["values"])) for a in data["axes"]),
                             int(data.get("repeats", 1)),
                             {str(k): tuple(str(x) for x in v) for k, v in (data.get("predict") or {}).items()},
                             (str(data["target"][0]), float(data["target"][1])) if data.get("target") else None,
                             {str(k): tuple(str(x) for x in v) for k, v in (data.get("holdout") or {}).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{SPEC_FILE} is not one tflab wrote ({exc})") from None


# -- reading what the user asked --------------------------------------------------------------


def parse_vary(specs: Iterable[str]) -> tuple[Axis, ...]:
    """`--vary AXIS=V1,V2,...` (repeatable): the sweep's axes, in the order given."""
    axes: list[Axis] = []
    for spec in specs:
        name, sep, text = str(spec).partition("=")
        name = name.strip()
        values = tuple(v.strip() for v in text.split(","))
        if not sep or not text.strip() or any(not v for v in values):
            raise UserError(f"--vary {spec!r} is not AXIS=V1,V2,... (axes: {', '.join(AXES)}, env.NAME)")
        if name not in AXES and not (name.startswith(ENV_AXIS) and knob_rules.ENV_NAME.match(name[len(ENV_AXIS):])):
            raise UserError(f"--vary {spec!r}: {name!r} is not an axis; the axes are {', '.join(AXES)} and env.NAME "
                            "(a variable, and {NAME} in the task's command)")
        if any(a.name == name for a in axes):
            raise UserError(f"--vary {name} is given twice; list all its values in one --vary {name}=V1,V2")
        if len(set(values)) != len(values):
            raise UserError(f"--vary {spec!r} lists a value twice")
        axes.append(Axis(name, values))
    return tuple(axes)


def parse_predict(specs: Iterable[str], axes: Sequence[Axis], flag: str = "--predict") -> dict[str, tuple[str, ...]]:
    """`--predict workers=8,16 --predict link-rate=1gbit --predict ps.cpus=2`: designs the cost model predicts,
    beyond the grid (the axes not given take each value measured); `--holdout workers=2` the same words."""
    predict: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        name, sep, text = str(spec).partition("=")
        name = name.strip()
        if name not in PREDICT_AXES or not sep:
            raise UserError(f"{flag} {spec!r}: the model predicts along {', '.join(PREDICT_AXES)}: "
                            f"write {flag} workers=8,16")
        values = tuple(v.strip() for v in text.split(","))
        if name == "workers" and not all(v.isascii() and v.isdigit() and 0 < int(v) <= 4096 for v in values):
            raise UserError(f"{flag} {spec!r}: workers are whole numbers from 1 to 4096")
        if name == "link-rate" and not all(numeric("link-rate", v) for v in values):
            raise UserError(f"{flag} {spec!r}: a link rate such as 100mbit or 1gbit")
        if name in ("cpus", "ps.cpus") and not all((numeric("cpus", v) or 0) > 0 for v in values):
            raise UserError(f"{flag} {spec!r}: CPUs are a number above 0, such as 0.5 or 2")
        predict[name] = values
    if predict and not any(a.name == "workers" for a in axes):
        raise UserError(f"{flag} needs a sweep that varies workers (--vary workers=1,2,3): the model is fitted "
                        "to how the throughput changes with them")
    return predict


def check(spec: SweepSpec, config: LabConfig, lab: Lab) -> None:
    """Every point's knobs checked against the lab before anything runs: a one-line error otherwise."""
    if len(spec.points()) > MAX_POINTS:
        raise UserError(f"the sweep has {len(spec.points())} points; at most {MAX_POINTS} (fewer values or repeats)")
    if not 1 <= spec.repeats <= 100:
        raise UserError(f"--repeats {spec.repeats} must be between 1 and 100")
    if not NAME.match(spec.name):
        raise UserError(f"--name {spec.name!r} is not a word (letters, digits, _ . -)")
    tasks = next((a.values for a in spec.axes if a.name == "task"), None)
    if tasks is not None and spec.task is not None:
        raise UserError(f"give the task once: `tflab sweep {spec.task}` or --vary task=..., not both")
    if tasks is None and spec.task is None:
        raise UserError("which task? `tflab sweep TASK --vary ...` (or --vary task=A,B)")
    for name in tasks or (spec.task,):
        check_task_name(name or "")
        config.task(name or "")
    if not spec.axes:
        raise UserError("a sweep varies something: --vary workers=1,2,3 (axes: workers, link-rate, cpus, task, "
                        "env.NAME)")
    host_cpus = len(config.host.cpus)
    for point in spec.points():
        knobs = point_knobs(point, lab, host_cpus)
        try:
            knob_rules.check_design(knobs, config.net_admin)
        except UserError as exc:
            raise UserError(f"--vary (point {point.describe()}): {exc}") from None


def point_task(spec: SweepSpec, point: Point) -> str:
    return point.values.get("task") or spec.task or ""


def point_knobs(point: Point, lab: Lab, host_cpus: int) -> Knobs:
    """The knobs of one point (a UserError naming the axis and value where the lab cannot take it)."""
    values = point.values
    env = [f"{name[len(ENV_AXIS):]}={value}" for name, value in values.items() if name.startswith(ENV_AXIS)]
    cpus = [values["cpus"]] if "cpus" in values else []
    try:
        return knob_rules.parse(lab, host_cpus, values.get("workers"), values.get("link-rate"), cpus, env)
    except UserError as exc:
        raise UserError(f"--vary (point {point.describe()}): {exc}") from None


# -- the sweep's folder -----------------------------------------------------------------------


def folder_of(runs_dir: Path, name: str) -> Path:
    return runs_dir / SWEEPS_DIR / name


def default_name(task: str | None) -> str:
    return f"{task or 'tasks'}-{time.strftime('%Y%m%d-%H%M%S')}"


def save_spec(folder: Path, spec: SweepSpec) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    _write(folder / SPEC_FILE, json.dumps(spec.as_dict(), indent=1) + "\n")


def load_spec(runs_dir: Path, name: str) -> SweepSpec:
    if not NAME.match(name):
        raise UserError(f"--resume {name!r} is not a sweep's name (`tflab sweeps` lists them)")
    path = folder_of(runs_dir, name) / SPEC_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no sweep {name!r} in {runs_dir / SWEEPS_DIR}; `tflab sweeps` lists them") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not one tflab wrote")
    return SweepSpec.from_dict(data)


def load_rows(folder: Path) -> list[dict[str, Any]]:
    """The rows written so far (a file another tool broke reads as none)."""
    try:
        rows = json.loads((folder / RESULTS_JSON).read_text())
    except (OSError, ValueError):
        return []
    return [r for r in rows if isinstance(r, dict) and isinstance(r.get("point"), str)] if isinstance(rows, list) \
        else []


def missing(spec: SweepSpec, rows: Sequence[Mapping[str, Any]]) -> list[Point]:
    done = {r["point"] for r in rows}
    return [p for p in spec.points() if p.key not in done]


def all_sweeps(runs_dir: Path) -> list[tuple[SweepSpec, list[dict[str, Any]]]]:
    found = []
    base = runs_dir / SWEEPS_DIR
    if base.is_dir():
        for folder in sorted(base.iterdir()):
            try:
                spec = load_spec(runs_dir, folder.name)
            except UserError:
                continue
            found.append((spec, load_rows(folder)))
    return found


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# -- rows -------------------------------------------------------------------------------------


PER_WORKER = " per worker"


def batch_of(batch: str | None, knobs: Knobs, lab: Lab) -> float | None:
    """A task's declared examples per step of the cluster's steps/s, its `{NAME}` filled from the point's --env
    knob, times the run's workers where it is per worker."""
    if batch is None:
        return None
    text = knob_rules.fill_env(batch, knobs.env)
    per_worker = text.endswith(PER_WORKER)
    try:
        value = float(text.removesuffix(PER_WORKER))
    except ValueError:
        return None
    if per_worker:
        workers = sum(1 for n in knob_rules.run_lab(lab, knobs).nodes if n.job == "worker")
        value *= max(1, workers)
    return value if value > 0 else None


def cpu_shares(lab: Lab, knobs: Knobs, host_cpus: int) -> tuple[float, float]:
    """(a worker's CPUs, a server's CPUs) in a run with these knobs: its share, or the host's where it has none."""
    run = knob_rules.run_lab(lab, knobs)

    def mean(job: str) -> float:
        shares = [n.share.cpus or float(host_cpus) for n in run.nodes if n.job == job]
        return round(sum(shares) / len(shares), 4) if shares else float(host_cpus)

    return mean("worker") if any(n.job == "worker" for n in run.nodes) else mean("chief"), mean("ps")


def row(spec: SweepSpec, point: Point, report: RunReport, run_folder: str, batch: float | None,
        nodes: Sequence[str], shares: tuple[float, float] | None = None) -> dict[str, Any]:
    """One point's row: its axes as written, its verdict and figures, each node's CPU and traffic."""
    rate = report.steady_steps_per_s or report.steps_per_s
    limit = report.limit or {}
    out: dict[str, Any] = {"point": point.key, **point.values, "repeat": point.repeat,
                           "verdict": report.verdict, "steps_per_s": rate,
                           "examples_per_s": round(rate * batch, 2) if rate and batch else None,
                           "first_step_s": report.first_step_s,
                           "limit": f"{limit['kind']}: {limit.get('evidence', '')}" if limit.get("kind") else None,
                           "worker_cpus": shares[0] if shares else None, "ps_cpus": shares[1] if shares else None,
                           "run": run_folder}
    for metric, value in (report.quality or {}).items():
        out[metric] = value
    if spec.target is not None:
        metric, goal = spec.target
        series = (report.quality_series or {}).get(metric) or []
        reached = quality.time_to(series, metric, goal)
        out[TARGET_COLUMN] = reached
        out["reached"] = reached is not None
    cluster = report.cluster or {}
    for node in nodes:
        figures = cluster.get(node) or {}
        out[f"{node}.cpu"] = figures.get("cpu")
        out[f"{node}.tx_mbit"] = figures.get("tx_mbit")
        out[f"{node}.rx_mbit"] = figures.get("rx_mbit")
    return out


def columns(spec: SweepSpec, nodes: Sequence[str], rows: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    known = set(COLUMNS) | {"point", *(a.name for a in spec.axes), TARGET_COLUMN, "reached"}
    metrics = [m for m in QUALITY_COLUMNS if any(r.get(m) is not None for r in rows)]
    metrics += sorted({k for r in rows for k in r if k not in known and "." not in k and k not in metrics})
    return ["point", *(a.name for a in spec.axes), *COLUMNS, *metrics,
            *([TARGET_COLUMN, "reached"] if spec.target else []),
            *(f"{node}.{what}" for node in nodes for what in ("cpu", "tx_mbit", "rx_mbit"))]


def save_rows(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]], nodes: Sequence[str]) -> None:
    """results.json and results.csv, whole, in grid order."""
    order = {p.key: p.number for p in spec.points()}
    ordered = sorted(rows, key=lambda r: order.get(r["point"], 0))
    _write(folder / RESULTS_JSON, json.dumps(ordered, indent=1) + "\n")
    names = columns(spec, nodes, ordered)
    tmp = folder / f".{RESULTS_CSV}.{os.getpid()}.tmp"
    with tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=names, extrasaction="ignore")
        writer.writeheader()
        for r in ordered:
            writer.writerow({k: "" if r.get(k) is None else r.get(k) for k in names})
    os.replace(tmp, folder / RESULTS_CSV)


def numeric(axis: str, value: str) -> float | None:
    """An axis value as a number for a plot's x (a link rate in Mbit/s), or None where it is not one."""
    if axis == "link-rate":
        if value == knob_rules.UNSHAPED:
            return None
        try:
            return links.rate_bits(links.parse_rate(value)) / 1e6
        except (UserError, AssertionError):
            return None
    if axis == "task":
        return None
    try:
        return float(value)
    except ValueError:
        return None
