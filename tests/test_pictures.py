"""Pictures of a run (run/pictures): its timeline, its Chrome trace and its one page, from literal events."""

from __future__ import annotations

import json
from pathlib import Path

from tflab.run import pictures
from tflab.run.events import Began, Exited, Printed, Serving
from tflab.run.history import RunRecorder
from tflab.run.machine import RunMachine
from tflab.run.runplan import RunPlan
from tflab.run.waits import where_it_waits


def finished_run(tmp_path: Path) -> tuple[RunMachine, object]:
    """ps0 serves; worker0 trains 0-300 steps over 30 s and ends 0; worker1 trains to step 100, then fails."""
    import fakeguard

    machine = RunMachine(RunPlan(servers=("ps0",), finishers=("worker0", "worker1"), chief="worker0"))
    events = [Began(0.0), Serving("ps0", 4.0)]
    events += [Printed("worker0", 8.0 + t, step=10 * t) for t in range(0, 31)]
    events += [Printed("worker1", 9.0 + t, step=10 * t) for t in range(0, 11)]
    events += [Exited("worker1", 1, 20.0, ended_by="exited")]
    events += [Exited("worker0", 143, 21.0, signal="SIGTERM", ended_by="stopped"),
               Exited("ps0", 143, 21.0, signal="SIGTERM", ended_by="stopped")]
    for event in events:
        machine.handle(event)
    machine.nodes["worker0"].stack = fakeguard.stack("own_retry_loop")[1]  # as a timeout's look would have read it
    machine.nodes["worker0"].wait = where_it_waits(machine.nodes["worker0"].stack)
    report = RunRecorder(tmp_path, "train", False, 0.0).write("finished", machine)
    return machine, report


def test_the_pictures_are_drawn_by_a_process_of_their_own_off_the_runs_way(tmp_path: Path) -> None:
    import time

    machine, report = finished_run(tmp_path)
    began = time.monotonic()
    pictures.write(tmp_path, "train", machine, report)
    assert time.monotonic() - began < 0.5 and (tmp_path / "trace.json").is_file(), "the trace at once"
    aside = tmp_path.parent / (tmp_path.name + ".aside")
    tmp_path.rename(aside)  # the next run of the task moves this one aside at once
    tmp_path.mkdir()
    deadline = time.monotonic() + 60
    while not (aside / "report.html").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (aside / "timeline.png").is_file() and (aside / "report.html").is_file(), "drawn in the run's own folder"
    assert not list(tmp_path.iterdir()), "nothing of it in the next run's"


def test_the_trace_has_a_process_per_node_its_phases_its_rate_and_its_end(tmp_path: Path) -> None:
    machine, report = finished_run(tmp_path)
    found = pictures.lanes(machine, report)
    assert [(lane.node, lane.start, lane.first_step, lane.end, lane.verdict, lane.how) for lane in found] == [
        ("ps0", 0.0, None, 21.0, "stopped", "143 SIGTERM"), ("worker0", 4.0, 8.0, 21.0, "stopped", "143 SIGTERM"),
        ("worker1", 4.0, 9.0, 20.0, "failed", "1")]
    events = pictures.trace("train", found, report)["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"ps0 (serves)", "worker0 (trains)", "worker1 (trains)"}
    training = next(e for e in events if e["name"] == "training" and e["pid"] == 3)
    assert (training["ts"], training["dur"]) == (9_000_000, 11_000_000)
    assert {e["args"]["steps/s"] for e in events if e["ph"] == "C" and e["pid"] == 2} == {10.0}
    assert any(e["ph"] == "i" and e["name"] == "end: failed (1)" and e["ts"] == 20_000_000 for e in events)


def test_the_three_files_are_written_and_the_page_stands_alone(tmp_path: Path) -> None:
    machine, report = finished_run(tmp_path)
    pictures.write(tmp_path, "train", machine, report, draw_now=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(tmp_path / "timeline.png")
    assert pixels.std() > 0.05, "a picture, not a blank page"
    json.loads((tmp_path / "trace.json").read_text())
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!doctype html>") and "data:image/png;base64," in page
    assert "<a href='logs/worker1.log'>log</a>" in page and "http" not in page.replace("https://", ""), \
        "self-contained: nothing fetched"
    assert "where worker0 waited" in page and "retry.py" in page
