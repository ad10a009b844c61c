"""Sweeps without an engine: the grid, its checks, its rows and files, resume's missing points, the cost model."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import cli

from tflab.errors import UserError
from tflab.plan.config import LabConfig, Task
from tflab.plan.shares import HostFacts
from tflab.plan.topology import Topology, plan
from tflab.run.runreport import RunReport
from tflab.run import costmodel, sweep, sweep_report

LAB = plan(Topology(nodes=4), [], HostFacts(cpus=(0, 1, 2, 3), memory_mib=8192))
CONFIG = LabConfig(name="t", topology=LAB.topology, host=HostFacts(cpus=(0, 1, 2, 3), memory_mib=8192),
                   tasks={"train": Task("train", "python t.py --batch={BATCH}", batch="{BATCH}"),
                          "other": Task("other", "python o.py")})


def spec_of(*vary: str, repeats: int = 1, task: str | None = "train", predict: tuple[str, ...] = ()) -> sweep.SweepSpec:
    axes = sweep.parse_vary(vary)
    return sweep.SweepSpec("s1", task, axes, repeats, sweep.parse_predict(predict, axes))


def test_the_grid_is_every_combination_in_order_with_its_repeats() -> None:
    spec = spec_of("workers=1,2", "link-rate=100mbit,none", repeats=2)
    points = spec.points()
    assert len(points) == 8
    assert [(p.values["workers"], p.values["link-rate"], p.repeat) for p in points[:3]] == [
        ("1", "100mbit", 1), ("1", "100mbit", 2), ("1", "none", 1)]
    assert points[0].key == "p001" and points[-1].key == "p008"
    knobs = sweep.point_knobs(points[2], LAB, 4)
    assert knobs.workers == 1 and knobs.link_rate == "none"
    assert sweep.SweepSpec.from_dict(json.loads(json.dumps(spec.as_dict()))) == spec


@pytest.mark.parametrize(("vary", "said"), [
    (["workers"], "is not AXIS=V1,V2"), (["speed=1,2"], "'speed' is not an axis"),
    (["workers=1,,2"], "is not AXIS=V1,V2"), (["workers=1,2", "workers=3"], "given twice"),
    (["workers=1,1"], "lists a value twice"), (["env.1X=3"], "is not an axis"),
])
def test_a_bad_axis_is_one_sentence(vary: list[str], said: str) -> None:
    with pytest.raises(UserError, match=said):
        sweep.parse_vary(vary)


def test_every_point_is_checked_against_the_lab_before_anything_runs() -> None:
    with pytest.raises(UserError, match=r"point workers=9\): --workers 9: this lab has 3 workers"):
        sweep.check(spec_of("workers=1,9"), CONFIG, LAB)
    with pytest.raises(UserError, match="no task"):
        sweep.check(spec_of("task=train,nope", task=None), CONFIG, LAB)
    with pytest.raises(UserError, match="give the task once"):
        sweep.check(spec_of("task=train,other"), CONFIG, LAB)
    with pytest.raises(UserError, match="--predict needs a sweep that varies workers"):
        spec_of("cpus=0.5,1", predict=("workers=8",))
    sweep.check(spec_of("workers=1,3", "cpus=0.5,1", "env.BATCH=32,64"), CONFIG, LAB)


def fake_run(steps_per_s: float, verdict: str = "ok") -> RunReport:
    return RunReport(task="train", state="finished", verdict=verdict, steady_steps_per_s=steps_per_s,
                     steps_per_s=steps_per_s * 0.9, first_step_s=4.2,
                     limit={"kind": "link", "evidence": "ps0 sent 95 Mbit/s of its 100mbit link"},
                     cluster={"ps0": {"cpu": 0.5, "tx_mbit": 95.0, "rx_mbit": 40.0}})


def test_rows_files_resume_and_report(tmp_path: Path) -> None:
    spec = spec_of("workers=1,2,3", "env.BATCH=32,64", predict=("workers=8",))
    nodes = LAB.names
    rows = []
    for point in spec.points()[:4]:
        knobs = sweep.point_knobs(point, LAB, 4)
        rate = 10.0 * int(point.values["workers"])
        run = replace(fake_run(rate), quality={"accuracy": 0.9})
        rows.append(sweep.row(spec, point, run, f"runs/{point.key}", sweep.batch_of("{BATCH}", knobs, LAB), nodes))
    sweep.save_spec(tmp_path, spec)
    sweep.save_rows(tmp_path, spec, rows, nodes)
    assert [p.key for p in sweep.missing(spec, sweep.load_rows(tmp_path))] == ["p005", "p006"]
    with (tmp_path / sweep.RESULTS_CSV).open() as handle:
        read = list(csv.DictReader(handle))
    assert read[1]["workers"] == "1" and read[1]["env.BATCH"] == "64" and read[1]["examples_per_s"] == "640.0"
    assert read[0]["limit"].startswith("link: ") and read[0]["ps0.tx_mbit"] == "95.0" and read[0]["worker2.cpu"] == ""
    assert set(sweep.COLUMNS) <= set(read[0])
    two = sweep.point_knobs(spec.points()[2], LAB, 4)
    assert sweep.batch_of("16 per worker", two, LAB) == 32 and sweep.batch_of("{BATCH} per worker", two, LAB) == 64
    assert sweep.batch_of("{OTHER}", two, LAB) is None
    found = sweep_report.write_all(tmp_path, spec, rows, costmodel.PS, "100mbit", sweep.missing(spec, rows))
    assert [p.name for p in found["plots"]] == ["examples-by-workers.png", "examples-by-env.BATCH.png",
                                                "accuracy-by-workers.png", "accuracy-by-env.BATCH.png"]
    assert found["plots"][0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report.md").read_text()
    assert "| 2 | 32 | 1 | ok | 20 | 640 | 4.2 | 0.9 | link |" in report
    assert "![examples-by-workers](examples-by-workers.png)" in report and "2 missing" in report
    # issue 63.11: every plot was captioned with the throughput's unit, the accuracy plot too
    assert "examples/s against workers:\n\n![examples-by-workers](examples-by-workers.png)" in report
    assert "accuracy (last printed) against workers:\n\n![accuracy-by-workers](accuracy-by-workers.png)" in report


def norm4(*terms: float) -> float:
    """The model's overlap of terms that happen at once: their 4-norm (a literal here, not the code's)."""
    return sum(t ** 4 for t in terms) ** 0.25


def test_the_cost_model_recovers_a_cluster_that_follows_it() -> None:
    # parameter servers: compute 0.01 s and the link's 0.5·N/B s at once: t = ‖0.01, 0.5 N / B‖₄, steps/s = N / t
    samples = [(n, n / norm4(0.01, 0.5 * n / b), b) for n in (1, 2, 3) for b in (20.0, 100.0)]
    fitted = costmodel.fit(costmodel.PS, samples)
    assert fitted is not None and fitted.error == pytest.approx(0.0, abs=1e-5) and len(fitted.errors) == 6
    c, _a, _kappa, beta = fitted.constants
    assert (c, beta) == pytest.approx((0.01, 0.5), rel=1e-3)
    assert fitted.predict(8, 100.0) == pytest.approx(8 / norm4(0.01, 0.5 * 8 / 100), rel=1e-3)
    assert fitted.dominant(8, 20.0) == "link" and fitted.dominant(1, 1000.0) == "worker-cpu"
    # ring all-reduce: t = 0.005 + 0.002·2(N-1) + 0.3·(2(N-1)/N)/B, one point 5% off
    ring = [(n, 1 / (0.005 + 0.002 * 2 * (n - 1) + 0.3 * 2 * (n - 1) / n / b), b) for n in (1, 2, 3) for b in (20.0, 100.0)]
    ring[2] = (ring[2][0], ring[2][1] * 1.05, ring[2][2])
    fitted = costmodel.fit(costmodel.ALLREDUCE, ring)
    assert fitted is not None and 0 < fitted.error < 0.1
    assert fitted.predict(3, 100.0) == pytest.approx(1 / (0.005 + 0.002 * 4 + 0.3 * 4 / 3 / 100), rel=0.1)
    assert "β = " in fitted.describe()
    # one worker count: nothing to fit; unshaped points count only where none is shaped
    assert costmodel.fit(costmodel.PS, [(2, 5.0, 20.0), (2, 6.0, 20.0)]) is None
    plain = costmodel.fit(costmodel.PS, [(1, 10.0, None), (2, 15.0, None), (3, 18.0, None), (2, 1.0, 20.0)])
    assert plain is None  # the only shaped point is one worker count


def test_the_model_explains_a_ps_whose_cpu_limits_and_predicts_other_shares() -> None:
    """Issue 37: the runs measured that the ps's CPU was the limit; the model has a term for it and follows the
    share: t = ‖0.02/s_w, 0.004·N/s_ps, 0.2·N/B‖₄ (c, κ, β), measured at two ps shares and two links."""
    def rate(n: int, link: float, s_w: float, s_ps: float) -> float:
        return n / norm4(0.02 / s_w, 0.004 * n / s_ps, 0.2 * n / link)

    points = [costmodel.Point(n, link, rate(n, link, 0.5, s_ps), 0.5, s_ps)
              for n in (1, 2, 3) for link in (20.0, 100.0) for s_ps in (0.25, 0.5)]
    fitted = costmodel.fit(costmodel.PS, points)
    assert fitted is not None and fitted.error == pytest.approx(0.0, abs=1e-4)
    c, _a, kappa, beta = fitted.constants
    assert (c, kappa, beta) == pytest.approx((0.02, 0.004, 0.2), rel=1e-2)
    assert fitted.dominant(3, 100.0, 0.5, 0.25) == "ps-cpu"
    # "what would ps0 do with 2 CPUs?": the ps term shrinks; the workers' compute then dominates (the link, on 10mbit)
    assert fitted.predict(3, 100.0, 0.5, 2.0) == pytest.approx(rate(3, 100.0, 0.5, 2.0), rel=1e-2)
    assert fitted.dominant(3, 100.0, 0.5, 2.0) == "worker-cpu" and fitted.dominant(3, 10.0, 0.5, 2.0) == "link"
    model = fitted.as_dict()
    assert model["constants"]["κ"] == pytest.approx(0.004, rel=1e-2) and model["leave_one_out_error"] < 1e-4


def test_a_held_out_point_is_predicted_by_a_fit_without_it_and_the_report_says_its_error(tmp_path: Path) -> None:
    spec = sweep.SweepSpec("h", "train", sweep.parse_vary(["workers=1,2,3", "link-rate=20mbit,100mbit"]), 1,
                           sweep.parse_predict(["ps.cpus=2"], sweep.parse_vary(["workers=1,2,3"])), None,
                           sweep.parse_predict(["workers=2"], sweep.parse_vary(["workers=1,2,3"]), "--holdout"))
    rows = []
    for point in spec.points():
        n, link = int(point.values["workers"]), float(point.values["link-rate"].replace("mbit", ""))
        steps = n / norm4(0.02 / 0.5, 0.004 * n / 0.5, 0.2 * n / link) * (1.03 if n == 2 else 1.0)
        report = RunReport(task="train", state="finished", verdict="ok", steady_steps_per_s=steps)
        rows.append(sweep.row(spec, point, report, f"runs/{point.key}", None, LAB.names, (0.5, 0.5)))
    found = sweep_report.write_all(tmp_path, spec, rows, costmodel.PS, None, [])
    (group,) = found["predicted"]
    assert [p["workers"] for p in group["measured"]] == [1, 1, 3, 3]
    # the fit never saw workers=2 (measured 3% above the cluster's own formula); from four points it keeps two terms
    assert [p["workers"] for p in group["held_out"]] == [2, 2] and all(0.02 < p["error"] < 0.08 for p in group["held_out"])
    assert {p["ps_cpus"] for p in group["predicted"]} == {2.0}
    report = (tmp_path / "report.md").read_text()
    shown = [line for line in report.splitlines() if "**held out of the fit**" in line]
    assert len(shown) == 2 and all(line.split(" | ")[3].endswith("%") for line in shown), shown
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    assert {p["kind"] for p in predictions} == {"predicted", "held out"} and all(p["dominant"] for p in predictions)
    model = json.loads((tmp_path / "model.json").read_text())[0]
    assert model["constants"]["c"] > 0 and set(model["constants"]) == {"c", "a", "κ", "β"}


def test_sweep_refuses_bad_input_before_the_engine(runner, tmp_path: Path, monkeypatch) -> None:
    from tflab.engine import daemon

    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    lab = tmp_path / "lab"
    assert runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "3"]).exit_code == 0
    monkeypatch.setattr(daemon, "client", lambda: (_ for _ in ()).throw(AssertionError("the engine was asked")))
    for args, said in ((["train", "--vary", "workers=1,5"], "--workers 5"),
                       (["train", "--vary", "link-rate=10mbit"], "NET_ADMIN"),
                       (["train"], "a sweep varies something"), (["--resume", "nope"], "no sweep 'nope'"),
                       (["train", "--vary", "workers=1,2", "--name", "a/b"], "is not a word"),
                       (["train", "--vary", "workers=1,2", "--repeats", "0"], "--repeats 0"),
                       (["train", "--vary", "workers=1,2", "--predict", "cpus=-1"], "CPUs are a number above 0"),
                       (["train", "--vary", "workers=1,2", "--predict", "link-rate=fast"], "a link rate such as"),
                       (["train", "--vary", "workers=1,2", "--holdout", "task=x"], "--holdout 'task=x'"),
                       (["train", "--vary", "workers=1,2", "--target", "accuracy"], "--target 'accuracy' is not"),
                       (["train", "--vary", "workers=1,2", "--target", "acc=nan"], "METRIC=VALUE")):
        result = runner.invoke(cli, ["sweep", *args, "--lab", str(lab)])
        assert result.exit_code != 0 and said in result.stderr, (args, result.stderr)
        assert result.stderr.startswith("tflab: error: ") and "Traceback" not in result.stderr
    assert not (lab / "runs" / "sweeps").exists()
    listed = runner.invoke(cli, ["sweeps", "--lab", str(lab)])
    assert listed.exit_code == 0 and "no sweeps yet" in listed.stdout


def test_quality_beside_speed_and_the_time_to_a_target(tmp_path: Path) -> None:
    """Issue 37: each point's accuracy and loss as the chief printed them, and when it reached --target."""
    spec = sweep.SweepSpec("q", "train", sweep.parse_vary(["workers=1,2"]), 1, {}, ("accuracy", 0.95))
    assert sweep.SweepSpec.from_dict(json.loads(json.dumps(spec.as_dict()))) == spec
    series = {1: [[5.0, 0.90], [9.0, 0.955], [12.0, 0.97]], 2: [[4.0, 0.80], [8.0, 0.94]]}
    rows = []
    for point in spec.points():
        n = int(point.values["workers"])
        report = RunReport(task="train", state="finished", verdict="ok", steady_steps_per_s=10.0 * n,
                           quality={"accuracy": series[n][-1][1], "loss": 0.1 / n},
                           quality_series={"accuracy": series[n], "loss": [[12.0, 0.1 / n]]})
        rows.append(sweep.row(spec, point, report, f"runs/{point.key}", None, LAB.names))
    assert [(r["accuracy"], r["loss"], r["time_to_target_s"], r["reached"]) for r in rows] == [
        (0.97, 0.1, 9.0, True), (0.94, 0.05, None, False)]
    sweep.save_rows(tmp_path, spec, rows, LAB.names)
    with (tmp_path / sweep.RESULTS_CSV).open() as handle:
        read = list(csv.DictReader(handle))
    assert (read[0]["accuracy"], read[0]["time_to_target_s"], read[1]["time_to_target_s"]) == ("0.97", "9.0", "")
    found = sweep_report.write_all(tmp_path, spec, rows, costmodel.PS, None, [])
    assert [p.name for p in found["plots"]] == ["steps-by-workers.png", "accuracy-by-workers.png",
                                                 "time_to_target_s-by-workers.png"]
    report = (tmp_path / "report.md").read_text()
    assert "| workers | repeat | verdict | steps/s | examples/s | first step (s) | accuracy | loss | " \
           "accuracy 0.95 after (s) | limit |" in report
    assert "| 1 | 1 | ok | 10 | - | - | 0.97 | 0.1 | 9 | - |" in report
    assert "| 2 | 1 | ok | 20 | - | - | 0.94 | 0.05 | never | - |" in report
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    point = EventAccumulator(str(next((tmp_path / "hparams").glob("*p001*")))).Reload()
    assert "sweep/accuracy" in point.Tags()["scalars"] and "sweep/time_to_target_s" in point.Tags()["scalars"]
