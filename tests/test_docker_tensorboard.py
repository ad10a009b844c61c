"""TensorBoard over the shared runs folder, seen by a real headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, cli, missing
from test_docker_run import shorten

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]
OUTPUT = REPO / "test-output"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    missing("no Chromium (scripts/test.sh installs it)")


def browse(url: str, screenshot: Path, height: int = 1000) -> str:
    """The page's DOM after its scripts ran, and a screenshot of it.

    TensorBoard draws only the cards in view: a taller window shows more of them.
    """
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--window-size=1400,{height}", "--virtual-time-budget=20000", "--run-all-compositor-stages-before-draw"]
    subprocess.run([*base, f"--screenshot={screenshot}", url], capture_output=True, timeout=120, check=True)
    return subprocess.run([*base, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=True).stdout


def test_training_scalars_show_in_tensorboard(labs, runner, tmp_path: Path) -> None:
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(REPO / "examples" / "prepare_data.py"), str(data)], check=True)
    lab = labs.gen(nodes=2, code=REPO / "examples", data=data)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    shorten(lab, "train", 300)  # curves to show, not an accuracy to reach
    trained = runner.invoke(cli, ["run", "train", "--lab", str(lab)])
    assert trained.exit_code == 0, trained.stdout[-2000:]
    started = runner.invoke(cli, ["tensorboard", "--lab", str(lab)])
    assert started.exit_code == 0, started.stderr
    port = labfiles.open_lab(lab).lab.chief.tensorboard_port
    url = f"http://127.0.0.1:{port}/"
    assert url in started.stdout
    assert f"TensorBoard: {url}" in trained.stdout, "every run names the lab's one TensorBoard (started by the run)"
    status = runner.invoke(cli, ["status", "--lab", str(lab)])
    assert f"TensorBoard: {url} (serving)" in status.stdout and "26006" not in status.stdout.split("TensorBoard:")[0], \
        "one URL, not a port per node"
    OUTPUT.mkdir(exist_ok=True)
    screenshot = OUTPUT / "tensorboard-scalars.png"
    wanted = ("accuracy", "loss", "global_step",  # the model's own curves (global_step/sec), the cluster beside:
              "cluster/cpu_used", "cluster/memory_mb", "cluster/net_tx_mbit", "cluster/steps_per_s",
              "train/cluster/worker0", "train/cluster/ps0")  # one run per node
    dom = ""
    for _ in range(5):  # TensorBoard finds new event files on its reload interval
        dom = browse(url + "#timeseries", screenshot, height=16000)
        if all(tag in dom for tag in wanted):
            break
        time.sleep(3)
    assert [tag for tag in wanted if tag not in dom] == [], dom[-2000:]
    browse(url + "#timeseries", screenshot)  # the first screen, to look at
    assert screenshot.stat().st_size > 10_000
    stopped = runner.invoke(cli, ["tensorboard", "--stop", "--lab", str(lab)])
    assert stopped.exit_code == 0
