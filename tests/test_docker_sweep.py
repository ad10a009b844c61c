"""`tflab sweep` on real containers: every point a run, every file written and read back (the CSV, the PNGs,
the HParams with TensorBoard's own reader), a prediction with its error, and --resume after a Ctrl-C."""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import cli
from test_docker_run import add_tasks

from tflab.run import runreport

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TFLAB = [sys.executable, "-m", "tflab"]

# A stand-in for training whose cluster follows the parameter-server cost model: each worker's step
# takes 0.03 + 0.01·N s, and the chief prints the global step (every worker's steps), as TF1 programs do.
STEPS = ("python -c \"import os, time; n = len(os.environ['TFLAB_WORKER_HOSTS'].split(',')); "
         "[print(f'step {i * n}', flush=True) or time.sleep(0.03 + 0.01 * n) for i in range(1, {STEPS_N})]\"")
SERVE = "if [ {job_name} = ps ]; then exec python -m http.server 2222; fi; "


@pytest.fixture(scope="module")
def sweep_lab(module_labs) -> Path:
    """ps0 and three workers, shared by the module's tests (each sweep has a name, and a folder, of its own)."""
    lab = module_labs.gen(nodes=4)
    add_tasks(lab, {"steps": {"command": SERVE + STEPS.replace("{STEPS_N}", "80"), "batch": "{BATCH}"},
                    "slow": SERVE + STEPS.replace("{STEPS_N}", "100")})
    up = CliRunner(mix_stderr=False).invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    return lab


@pytest.mark.alone  # the points' rates against the cost model, and the prediction's error, are measured
def test_a_sweep_runs_every_point_and_writes_what_it_found(sweep_lab: Path, runner) -> None:
    lab = sweep_lab
    result = runner.invoke(cli, ["sweep", "steps", "--vary", "workers=1,2,3", "--vary", "env.BATCH=16,32",
                                 "--name", "grid", "--predict", "workers=6", "--lab", str(lab)])
    assert result.exit_code == 0, result.stdout + result.stderr
    out = result.stdout
    assert "sweep grid: 6 of 6 points to run" in out and "point 6/6 (workers=3, env.BATCH=32, repeat 1): ok" in out
    folder = lab / "runs" / "sweeps" / "grid"
    with (folder / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["workers"], r["env.BATCH"], r["verdict"]) for r in rows] == [
        ("1", "16", "ok"), ("1", "32", "ok"), ("2", "16", "ok"), ("2", "32", "ok"), ("3", "16", "ok"), ("3", "32", "ok")]
    rates = {(r["workers"], r["env.BATCH"]): float(r["steps_per_s"]) for r in rows}
    # the cluster's global steps/s grows with its workers as the stand-in says: N / (0.03 + 0.01 N)
    for n in (1, 2, 3):
        assert rates[(str(n), "16")] == pytest.approx(n / (0.03 + 0.01 * n), rel=0.35)
    assert float(rows[1]["examples_per_s"]) == pytest.approx(32 * float(rows[1]["steps_per_s"]), rel=0.01)
    assert rows[0]["limit"] and rows[0]["ps0.cpu"] != "" and "worker2.tx_mbit" in rows[0]
    assert json.loads((folder / "results.json").read_text())[5]["workers"] == "3"
    # every run kept under the sweep, each with its own run.json and knobs
    kept = json.loads((folder / rows[4]["run"] / "run.json").read_text())
    assert kept["knobs"]["workers"] == 3 and kept["knobs"]["env"] == {"BATCH": "16"}
    # the plots decode as images of the size drawn
    from PIL import Image

    for name in ("examples-by-workers.png", "examples-by-env.BATCH.png"):
        with Image.open(folder / name) as image:
            image.load()
            assert image.size == (640, 420)
    # the report: the table, the plots, the limits, and the prediction with its measured error
    report = (folder / "report.md").read_text()
    assert "![examples-by-workers](examples-by-workers.png)" in report and "## What limited each run" in report
    assert "t = a + ‖c/s_w, κ·N/s_ps, β·N/B‖₄; steps/s = N / t" in report and "| 6 workers at unshaped, " in report
    assert "**predicted**" in report
    # the stand-in follows the model (t = 0.03 + 0.01 N): its prediction for 6 workers, and the error it states
    match = re.search(r"predicted by the cost model \(parameter servers; env.BATCH=16\): 6 workers at unshaped, "
                      r"[\d.]+ CPU a worker, [\d.]+ CPU a ps: ([\d.]+) examples/s \(([a-z-]+)\); its leave-one-out "
                      r"error on the measured points: (\d+)%", " ".join(out.split()))
    assert match, out
    assert float(match.group(1)) == pytest.approx(16 * 6 / (0.03 + 0.01 * 6), rel=0.4)
    assert int(match.group(3)) < 30
    predictions = json.loads((folder / "predictions.json").read_text())
    assert {p["workers"] for p in predictions if p["kind"] == "predicted"} == {6} and predictions[0]["dominant"]
    # HParams, read back as TensorBoard reads them
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer
    from tensorboard.plugins.hparams import plugin_data_pb2

    multiplexer = EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(folder / "hparams"))
    multiplexer.Reload()
    sessions = {}
    for run, tags in multiplexer.PluginRunToTagToContent("hparams").items():
        for content in tags.values():
            data = plugin_data_pb2.HParamsPluginData.FromString(content)
            if data.HasField("session_start_info"):
                info = data.session_start_info.hparams
                sessions[run] = (info["workers"].number_value, info["env.BATCH"].number_value)
    assert sorted(sessions.values()) == [(1, 16), (1, 32), (2, 16), (2, 32), (3, 16), (3, 32)]
    listed = runner.invoke(cli, ["sweeps", "--lab", str(lab)])
    assert "grid" in listed.stdout and "6/6" in listed.stdout


@pytest.mark.waits  # times nothing: it waits on the stand-ins' sleeps, and stops the sweep in its second point
def test_a_stopped_sweep_keeps_what_finished_and_resume_runs_only_the_rest(sweep_lab: Path, runner) -> None:
    lab = sweep_lab
    child = subprocess.Popen([*TFLAB, "sweep", "slow", "--vary", "workers=1,2,3", "--name", "cut", "--lab", str(lab)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = lab / "runs" / "sweeps" / "cut"
    deadline = time.monotonic() + 180
    while True:  # until the first point has its row and the second one's run is training
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the sweep did not get to its second point"
        second = runreport.load(lab / "runs" / "slow")
        if (folder / "results.json").exists() and second is not None and second.state == "running":
            break
        time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, out + err
    assert "stopped with 2 of 3 points missing; `tflab sweep --resume cut` runs them" in err.replace("\n", " ")
    rows = json.loads((folder / "results.json").read_text())
    assert [r["point"] for r in rows] == ["p001"]
    first = (folder / "runs" / "p001" / "run.json").stat().st_mtime

    resumed = runner.invoke(cli, ["sweep", "--resume", "cut", "--lab", str(lab)])
    assert resumed.exit_code == 0, resumed.stdout + resumed.stderr
    assert "sweep cut: 2 of 3 points to run" in resumed.stdout
    assert "point 1/3" not in resumed.stdout and "point 3/3 (workers=3, repeat 1): ok" in resumed.stdout
    assert [r["point"] for r in json.loads((folder / "results.json").read_text())] == ["p001", "p002", "p003"]
    assert (folder / "runs" / "p001" / "run.json").stat().st_mtime == first
    again = runner.invoke(cli, ["sweep", "--resume", "cut", "--lab", str(lab)])
    assert again.exit_code == 0 and "every point has run" in again.stdout
