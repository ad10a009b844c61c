"""What a sweep found, to look at: PNG plots, report.md, TensorBoard HParams records, and predictions.

The plots put throughput (examples/s where known, else steps/s) against each numeric axis, a
line per combination of the other axes, each point the mean over repeats with its spread (the
lowest and highest repeat) as an error bar. The HParams records (one session per point, written
with tensorboardX: no TensorFlow on the host) make `tflab tensorboard` show the sweep in
TensorBoard's HParams dashboard. The predictions come from `costmodel`, fitted over workers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tflab.plan.knobs import UNSHAPED
from tflab.run import costmodel
from tflab.run.sweep import QUALITY_COLUMNS, TARGET_COLUMN, Point, SweepSpec, numeric

log = logging.getLogger("tflab.sweep")
REPORT = "report.md"
MODEL_FILE = "model.json"
PREDICTIONS_FILE = "predictions.json"
HPARAMS_DIR = "hparams"
OUTSIDE_MODEL = ("host", "memory")  # limits the cost model has no term for
UNITS = {"workers": "workers", "link-rate": "link rate (Mbit/s)", "cpus": "CPUs per node"}


def throughput(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(column, label) the plots and the model use: examples/s where every finished row has it, else steps/s."""
    done = [r for r in rows if r.get("steps_per_s")]
    if done and all(r.get("examples_per_s") for r in done):
        return "examples_per_s", "examples/s"
    return "steps_per_s", "steps/s"


def numeric_axes(spec: SweepSpec) -> list[str]:
    return [a.name for a in spec.axes if all(numeric(a.name, v) is not None for v in a.values) and len(a.values) > 1]


def plotted(spec: SweepSpec, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(column, label) of each plot an axis gets: throughput, then quality (the chief's accuracy, else its loss),
    then the time to the target where one was asked for."""
    shown = [throughput(rows)]
    metric = next((m for m in QUALITY_COLUMNS if any(r.get(m) is not None for r in rows)), None)
    if metric is not None:
        shown.append((metric, f"{metric} (last printed)"))
    if spec.target and any(r.get(TARGET_COLUMN) is not None for r in rows):
        shown.append((TARGET_COLUMN, f"seconds to {spec.target[0]} {spec.target[1]:g}"))
    return shown


def prepare() -> None:
    """Import what the findings are drawn, fitted and written with (matplotlib, scipy, tensorboardX: about 2 s of a
    CPU here), ahead: a sweep does it beside its first point, which mostly waits on its nodes, so that writing the
    findings at its end waits on no import (bench/: a point at the speed of a typed run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
        import matplotlib.ticker  # noqa: F401
        import scipy.optimize  # noqa: F401
        import tensorboardX  # noqa: F401
        import tensorboardX.summary  # noqa: F401
    except Exception:  # noqa: BLE001 - the writing imports them itself, and says what fails there
        log.debug("could not import the findings' libraries ahead", exc_info=True)


def plot(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]]) -> list[Path]:
    """One PNG per numeric axis and measure (speed, quality, time to target): the measure against the axis, a line
    per combination of the other axes."""
    made = []
    for column, label in plotted(spec, rows):
        made += _plot(folder, spec, rows, column, label)
    return made


def _plot(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]], column: str, label: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for axis in numeric_axes(spec):
        others = [a.name for a in spec.axes if a.name != axis]
        lines: dict[tuple[str, ...], dict[float, list[float]]] = {}
        for r in rows:
            value = r.get(column)
            x = numeric(axis, str(r.get(axis)))
            if value is None or x is None:
                continue
            lines.setdefault(tuple(str(r.get(o)) for o in others), {}).setdefault(x, []).append(float(value))
        if not lines:
            continue
        figure, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
        def order(item: tuple) -> tuple:  # legend in the axes' own order of values (20mbit before 100mbit)
            return tuple(_position(spec, o, v) for o, v in zip(others, item[0]))

        for combo, points in sorted(lines.items(), key=order):
            xs = sorted(points)
            means = [sum(points[x]) / len(points[x]) for x in xs]
            low = [m - min(points[x]) for x, m in zip(xs, means)]
            high = [max(points[x]) - m for x, m in zip(xs, means)]
            name = ", ".join(f"{o}={v}" for o, v in zip(others, combo)) or "measured"
            ax.errorbar(xs, means, yerr=[low, high], marker="o", capsize=4, label=name)
        if axis == "workers":
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(UNITS.get(axis, axis))
        ax.set_ylabel(label)
        ax.set_title(f"{spec.name}: {label} against {axis}")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if any(others):
            ax.legend(fontsize="small")
        path = folder / f"{column.replace('_per_s', '')}-by-{axis}.png"
        figure.tight_layout()
        figure.savefig(path)
        plt.close(figure)
        made.append(path)
    return made


def _position(spec: SweepSpec, axis: str, value: str) -> int:
    for a in spec.axes:
        if a.name == axis and value in a.values:
            return a.values.index(value)
    return 0


def hparam_value(spec: SweepSpec, axis: str, value: str) -> float | str:
    """A numeric axis as a number (TensorBoard sorts and plots it), any other as its text."""
    if axis in numeric_axes(spec) and axis != "link-rate":
        number = numeric(axis, value)
        if number is not None:
            return number
    return value


def write_hparams(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]]) -> Path:
    """One HParams session per finished point (under hparams/POINT), rewritten whole."""
    import shutil

    from tensorboardX import SummaryWriter

    target = folder / HPARAMS_DIR
    shutil.rmtree(target, ignore_errors=True)
    with SummaryWriter(logdir=str(target)) as writer:
        for r in rows:
            hparams: dict[str, Any] = {a.name: hparam_value(spec, a.name, str(r.get(a.name))) for a in spec.axes}
            hparams["repeat"] = int(r.get("repeat") or 1)
            keys = ("steps_per_s", "examples_per_s", "first_step_s", *QUALITY_COLUMNS, TARGET_COLUMN)
            metrics = {f"sweep/{key}": float(r[key]) for key in keys
                       if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)}
            metrics["sweep/ok"] = 1.0 if r.get("verdict") == "ok" else 0.0
            writer.add_hparams(hparams, metrics, name=str(r["point"]))
    return target


def predictions(spec: SweepSpec, rows: Sequence[Mapping[str, Any]], strategy: str, lab_rate: str | None,
                per_worker: bool = False) -> list[dict[str, Any]]:
    """The cost model fitted over workers, links and CPU shares (one fit per combination of the other axes, the
    --holdout points left out of it), its error at each measured point and at the held-out ones, and its
    predictions at the --predict designs (each axis not given takes the values measured), each with the term
    that dominates it."""
    if "workers" not in {a.name for a in spec.axes}:
        return []
    column, label = throughput(rows)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("verdict") != "ok" or not r.get("steps_per_s"):
            continue
        key = ", ".join(f"{a.name}={r.get(a.name)}" for a in spec.axes if a.name not in MODEL_AXES)
        groups.setdefault(key, []).append(r)
    found = []
    for key, members in groups.items():
        fitted_on: list[costmodel.Point] = []
        held: list[costmodel.Point] = []
        per_step: list[float] = []  # examples one step takes, per worker where the batch is per worker
        for r in members:
            point = _model_point(r, lab_rate)
            (held if _held_out(spec, r) else fitted_on).append(point)
            if column != "steps_per_s":
                ratio = float(r[column]) / float(r["steps_per_s"])
                per_step.append(ratio / point.workers if per_worker else ratio)
        limits = sorted({str(r.get("limit") or "").split(":", 1)[0] for r in members} - {"", "none"})
        fitted = costmodel.fit(strategy, fitted_on, limits)
        if fitted is None:
            continue
        examples = sum(per_step) / len(per_step) if per_step else 1.0
        shaped = any(p.link_mbit for p in fitted_on)

        def scale(n: int, examples: float = examples) -> float:
            return examples * n if per_worker and column != "steps_per_s" else examples

        def design(p: costmodel.Point, shaped: bool = shaped) -> dict[str, Any]:
            text = (f"{p.workers} worker{'s' if p.workers != 1 else ''} at "
                    f"{f'{p.link_mbit:g} Mbit/s' if shaped else 'unshaped'}, {p.worker_cpus:g} CPU a worker"
                    + (f", {p.ps_cpus:g} CPU a ps" if strategy == costmodel.PS else ""))
            return {"design": text, "workers": p.workers, "link_mbit": p.link_mbit if shaped else None,
                    "worker_cpus": p.worker_cpus, "ps_cpus": p.ps_cpus,
                    "dominant": fitted.dominant(p.workers, p.link_mbit, p.worker_cpus, p.ps_cpus)}

        def predicted_value(p: costmodel.Point) -> float:
            return fitted.predict(p.workers, p.link_mbit, p.worker_cpus, p.ps_cpus) * scale(p.workers)

        outside = sorted({str(r.get("limit")).split(":", 1)[0] for r in members
                          if str(r.get("limit") or "").split(":", 1)[0] in OUTSIDE_MODEL})
        held_points = costmodel.fit(strategy, held + fitted_on, limits)  # repeats averaged the same way
        held_keys = {p.key for p in held}
        found.append({
            "group": key or "all points", "fit": fitted, "unit": label, "outside": outside,
            "measured": [{**design(p), "value": p.rate * scale(p.workers), "error": fitted.errors.get(p.key)}
                         for p in fitted.points],
            "held_out": [{**design(p), "value": p.rate * scale(p.workers), "predicted": predicted_value(p),
                          "error": abs(predicted_value(p) - p.rate * scale(p.workers)) / (p.rate * scale(p.workers))}
                         for p in (held_points.points if held_points else ()) if p.key in held_keys],
            "predicted": [{**design(p), "value": predicted_value(p)} for p in _wanted(spec, fitted)],
        })
    return found


MODEL_AXES = ("workers", "link-rate", "cpus")  # what the model itself varies over (one fit across them)


def _model_point(r: Mapping[str, Any], lab_rate: str | None) -> costmodel.Point:
    link = str(r.get("link-rate") or lab_rate or UNSHAPED)
    return costmodel.Point(int(str(r["workers"])), numeric("link-rate", link) or 0.0, float(r["steps_per_s"]),
                           float(r.get("worker_cpus") or 1.0), float(r.get("ps_cpus") or 1.0))


def _held_out(spec: SweepSpec, r: Mapping[str, Any]) -> bool:
    return bool(spec.holdout) and all(str(r.get(axis)) in values for axis, values in spec.holdout.items())


def _wanted(spec: SweepSpec, fitted: costmodel.Fit) -> list[costmodel.Point]:
    """The --predict designs: each axis given takes its values, the others each value measured."""
    if not spec.predict:
        return []
    measured = fitted.points
    workers = [int(v) for v in spec.predict.get("workers", ())] or sorted({p.workers for p in measured})
    links = [numeric("link-rate", v) or 0.0 for v in spec.predict.get("link-rate", ())] \
        or sorted({p.link_mbit for p in measured})
    worker_cpus = [float(v) for v in spec.predict.get("cpus", ())] or sorted({p.worker_cpus for p in measured})
    ps_cpus = [float(v) for v in spec.predict.get("ps.cpus", spec.predict.get("cpus", ()))] \
        or sorted({p.ps_cpus for p in measured})
    return [costmodel.Point(n, link, 0.0, s_w, s_ps) for link in links for n in workers
            for s_w in worker_cpus for s_ps in ps_cpus]


def write_model(folder: Path, predicted: Sequence[Mapping[str, Any]]) -> None:
    """model.json (each group's fitted constants and errors) and predictions.json (each prediction, with the term
    that dominates it, and the held-out points' predicted and measured values)."""
    import json

    models = [{"group": g["group"], **g["fit"].as_dict()} for g in predicted]
    (folder / MODEL_FILE).write_text(json.dumps(models, indent=1) + "\n")
    rows = [{"group": g["group"], "kind": "predicted", "unit": g["unit"], **p} for g in predicted for p in g["predicted"]]
    rows += [{"group": g["group"], "kind": "held out", "unit": g["unit"], **p} for g in predicted for p in g["held_out"]]
    (folder / PREDICTIONS_FILE).write_text(json.dumps(rows, indent=1) + "\n")


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "\\|")


def write_report(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]], plots: Sequence[Path],
                 predicted: Sequence[Mapping[str, Any]], strategy: str, missing: Sequence[Point]) -> Path:
    """report.md: the table, the plots, the limits found, and the predictions with their measured error."""
    axes = [a.name for a in spec.axes]
    metrics = [m for m in QUALITY_COLUMNS if any(r.get(m) is not None for r in rows)]
    target = [f"{spec.target[0]} {spec.target[1]:g} after (s)"] if spec.target else []
    lines = [f"# Sweep {spec.name}", "",
             f"Task {spec.task or 'per point (the task axis)'}; axes: "
             + "; ".join(f"{a.name} = {', '.join(a.values)}" for a in spec.axes)
             + f"; {spec.repeats} repeat{'s' if spec.repeats > 1 else ''} each. {len(rows)} point"
             + f"{'s' if len(rows) != 1 else ''} run"
             + (f", {len(missing)} missing (`tflab sweep --resume {spec.name}` runs them)." if missing else "."),
             "", "## Results", "",
             "| " + " | ".join([*axes, "repeat", "verdict", "steps/s", "examples/s", "first step (s)", *metrics,
                                *target, "limit"]) + " |",
             "|" + "---|" * (len(axes) + 6 + len(metrics) + len(target))]
    for r in rows:
        limit = str(r.get("limit") or "-").split(":", 1)[0]
        reached = ([r.get(TARGET_COLUMN) if r.get(TARGET_COLUMN) is not None else "never"] if spec.target else [])
        lines.append("| " + " | ".join(_cell(x) for x in [*(r.get(a) for a in axes), r.get("repeat"), r.get("verdict"),
                                                            r.get("steps_per_s"), r.get("examples_per_s"),
                                                            r.get("first_step_s"), *(r.get(m) for m in metrics),
                                                            *reached, limit]) + " |")
    if plots:  # each plot under its own measure's caption (an accuracy plot is no throughput plot)
        measures = {c.replace("_per_s", ""): shown for c, shown in plotted(spec, rows)}
        lines += ["", "## Plots", "", "Each point is the mean over repeats; the bars span the lowest and highest repeat."]
        for p in plots:
            measure, _, axis = p.stem.partition("-by-")
            lines += ["", f"{measures.get(measure, measure)} against {axis}:", "", f"![{p.stem}]({p.name})"]
    lines += ["", "## What limited each run", ""]
    for r in rows:
        values = ", ".join(f"{a}={r.get(a)}" for a in axes)
        lines.append(f"- {values} (repeat {r.get('repeat')}): {r.get('limit') or 'not measured'}")
    if predicted:
        formula = costmodel.FORMULAS[strategy]
        lines += ["", "## Beyond the grid: the cost model", "",
                  f"Strategy: {strategy}. Model: `{formula}`, N the workers, B the link's rate (Mbit/s), s_w and s_ps "
                  "a worker's and a server's CPUs; c is the compute (CPU·s) a step takes, a or α the latency of a "
                  "message round, b a synchronous step's barrier, κ the CPU work (CPU·s) of serving or reducing the "
                  "model, β the model's megabits "
                  "over the link; ‖…‖₄ is what happens at once, the slowest setting the pace. Fitted with SciPy's "
                  "bounded least squares to every measured point at once (each with its own link and shares, on "
                  "relative errors), the terms the points can tell apart chosen by AICc; the error is leave-one-out "
                  "(each measured point predicted by a fit of the same terms without it). Predicted rows are "
                  "predictions, not runs; each says which term dominates its step (model.json, predictions.json).",
                  ""]
        for group in predicted:
            fitted: costmodel.Fit = group["fit"]
            error = fitted.error
            lines += [f"### {group['group']}", "",
                      f"{fitted.describe()}; leave-one-out error "
                      + (f"{error:.0%} (mean over {len(fitted.errors)} points)" if error is not None
                         else "not measurable (no more points than constants)"), "",
                      f"| design | {group['unit']} | kind | error | dominant term |", "|---|---|---|---|---|"]
            for p in group["measured"]:
                shown = "-" if p["error"] is None else f"{p['error']:.0%}"
                lines.append(f"| {p['design']} | {p['value']:.4g} | measured | {shown} | {p['dominant']} |")
            for p in group["held_out"]:
                lines.append(f"| {p['design']} | {p['value']:.4g} measured, {p['predicted']:.4g} predicted | "
                             f"**held out of the fit** | {p['error']:.0%} | {p['dominant']} |")
            for p in group["predicted"]:
                lines.append(f"| {p['design']} | {p['value']:.4g} | **predicted** | - | {p['dominant']} |")
            if group["outside"]:
                lines += ["", f"Measured points were limited by {' and '.join(group['outside'])}: the model's CPU "
                              "terms follow the servers' and workers' shares, but not a busy host or memory."]
            lines.append("")
    path = folder / REPORT
    path.write_text("\n".join(lines) + "\n")
    return path


def write_all(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]], strategy: str,
              lab_rate: str | None, missing: Sequence[Point], per_worker: bool = False) -> dict[str, Any]:
    """Every file of the sweep's findings from its rows; what was written."""
    plots = plot(folder, spec, rows)
    hparams = write_hparams(folder, spec, rows)
    predicted = predictions(spec, rows, strategy, lab_rate, per_worker)
    write_model(folder, predicted)
    report = write_report(folder, spec, rows, plots, predicted, strategy, missing)
    return {"plots": plots, "hparams": hparams, "report": report, "predicted": predicted}
