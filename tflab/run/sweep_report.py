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
from tflab.run.sweep import Point, SweepSpec, numeric

log = logging.getLogger("tflab.sweep")
REPORT = "report.md"
HPARAMS_DIR = "hparams"
OUTSIDE_MODEL = ("ps-cpu", "host", "memory")  # limits the alpha-beta model has no term for
UNITS = {"workers": "workers", "link-rate": "link rate (Mbit/s)", "cpus": "CPUs per node"}


def throughput(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(column, label) the plots and the model use: examples/s where every finished row has it, else steps/s."""
    done = [r for r in rows if r.get("steps_per_s")]
    if done and all(r.get("examples_per_s") for r in done):
        return "examples_per_s", "examples/s"
    return "steps_per_s", "steps/s"


def numeric_axes(spec: SweepSpec) -> list[str]:
    return [a.name for a in spec.axes if all(numeric(a.name, v) is not None for v in a.values) and len(a.values) > 1]


def plot(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]]) -> list[Path]:
    """One PNG per numeric axis: throughput against it, a line per combination of the other axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    column, label = throughput(rows)
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
            metrics = {f"sweep/{key}": float(r[key]) for key in ("steps_per_s", "examples_per_s", "first_step_s")
                       if isinstance(r.get(key), (int, float))}
            metrics["sweep/ok"] = 1.0 if r.get("verdict") == "ok" else 0.0
            writer.add_hparams(hparams, metrics, name=str(r["point"]))
    return target


def predictions(spec: SweepSpec, rows: Sequence[Mapping[str, Any]], strategy: str, lab_rate: str | None,
                per_worker: bool = False) -> list[dict[str, Any]]:
    """The cost model fitted over workers and links (one fit per combination of the other axes), and its
    predictions at `--predict workers=...` for each link measured."""
    if "workers" not in {a.name for a in spec.axes}:
        return []
    column, label = throughput(rows)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("verdict") != "ok" or not r.get("steps_per_s"):
            continue
        key = ", ".join(f"{a.name}={r.get(a.name)}" for a in spec.axes if a.name not in ("workers", "link-rate"))
        groups.setdefault(key, []).append(r)
    found = []
    for key, members in groups.items():
        samples = []
        per_step: list[float] = []  # examples one step takes, per worker where the batch is per worker
        for r in members:
            workers = int(str(r["workers"]))
            link = str(r.get("link-rate") or lab_rate or UNSHAPED)
            mbit = numeric("link-rate", link)
            samples.append((workers, float(r["steps_per_s"]), mbit))
            if column != "steps_per_s":
                ratio = float(r[column]) / float(r["steps_per_s"])
                per_step.append(ratio / workers if per_worker else ratio)
        fitted = costmodel.fit(strategy, samples)
        if fitted is None:
            continue
        examples = sum(per_step) / len(per_step) if per_step else 1.0

        def scale(n: int, examples: float = examples) -> float:
            return examples * n if per_worker and column != "steps_per_s" else examples

        links = sorted({p.link_mbit for p in fitted.points})
        wanted = [int(v) for v in spec.predict.get("workers", ())]
        shown_link = (lambda mbit: f"{mbit:g} Mbit/s") if any(s[2] for s in samples) else (lambda mbit: "unshaped")
        outside = sorted({str(r.get("limit")).split(":", 1)[0] for r in members
                          if str(r.get("limit") or "").split(":", 1)[0] in OUTSIDE_MODEL})
        found.append({
            "group": key or "all points", "fit": fitted, "unit": label, "outside": outside,
            "measured": [(p.workers, shown_link(p.link_mbit), p.rate * scale(p.workers),
                          fitted.errors.get((p.workers, p.link_mbit))) for p in fitted.points],
            "predicted": [(n, shown_link(link), fitted.predict(n, link) * scale(n)) for link in links for n in wanted],
        })
    return found


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "\\|")


def write_report(folder: Path, spec: SweepSpec, rows: Sequence[Mapping[str, Any]], plots: Sequence[Path],
                 predicted: Sequence[Mapping[str, Any]], strategy: str, missing: Sequence[Point]) -> Path:
    """report.md: the table, the plots, the limits found, and the predictions with their measured error."""
    column, label = throughput(rows)
    axes = [a.name for a in spec.axes]
    lines = [f"# Sweep {spec.name}", "",
             f"Task {spec.task or 'per point (the task axis)'}; axes: "
             + "; ".join(f"{a.name} = {', '.join(a.values)}" for a in spec.axes)
             + f"; {spec.repeats} repeat{'s' if spec.repeats > 1 else ''} each. {len(rows)} point"
             + f"{'s' if len(rows) != 1 else ''} run"
             + (f", {len(missing)} missing (`tflab sweep --resume {spec.name}` runs them)." if missing else "."),
             "", "## Results", "",
             "| " + " | ".join([*axes, "repeat", "verdict", "steps/s", "examples/s", "first step (s)", "limit"]) + " |",
             "|" + "---|" * (len(axes) + 6)]
    for r in rows:
        limit = str(r.get("limit") or "-").split(":", 1)[0]
        lines.append("| " + " | ".join(_cell(x) for x in [*(r.get(a) for a in axes), r.get("repeat"), r.get("verdict"),
                                                            r.get("steps_per_s"), r.get("examples_per_s"),
                                                            r.get("first_step_s"), limit]) + " |")
    if plots:
        lines += ["", "## Plots", "", f"{label} (mean over repeats; the bars span the lowest and highest repeat).", ""]
        lines += [f"![{p.stem}]({p.name})" for p in plots]
    lines += ["", "## What limited each run", ""]
    for r in rows:
        values = ", ".join(f"{a}={r.get(a)}" for a in axes)
        lines.append(f"- {values} (repeat {r.get('repeat')}): {r.get('limit') or 'not measured'}")
    if predicted:
        formula = costmodel.FORMULAS[strategy]
        lines += ["", "## Beyond the grid: the cost model", "",
                  f"Strategy: {strategy}. Model (alpha-beta): `{formula}`, N the workers, B the link's rate (Mbit/s); "
                  "c is the compute seconds per step, α the seconds per message round, β the model's megabits per "
                  "step over the link. Fitted by least squares to every measured point at once (each with its own "
                  "link), no constant negative; the error is leave-one-out (each measured point predicted by a fit "
                  "without it). Predicted rows are predictions, not runs.", ""]
        for group in predicted:
            fitted: costmodel.Fit = group["fit"]
            error = fitted.error
            lines += [f"### {group['group']}", "",
                      f"{fitted.describe()}; leave-one-out error "
                      + (f"{error:.0%} (mean over {len(fitted.errors)} points)" if error is not None
                         else "not measurable (no more points than constants)"), "",
                      f"| workers | link | {group['unit']} | kind | error |", "|---|---|---|---|---|"]
            for n, link, value, err in group["measured"]:
                lines.append(f"| {n} | {link} | {value:.4g} | measured | {f'{err:.0%}' if err is not None else '-'} |")
            for n, link, value in group["predicted"]:
                lines.append(f"| {n} | {link} | {value:.4g} | **predicted** | - |")
            if group["outside"]:
                lines += ["", f"Caution: measured points were limited by {' and '.join(group['outside'])}, which the "
                              "model has no term for; beyond them its predictions are optimistic (more workers load "
                              "that limit further)."]
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
    report = write_report(folder, spec, rows, plots, predicted, strategy, missing)
    return {"plots": plots, "hparams": hparams, "report": report, "predicted": predicted}
