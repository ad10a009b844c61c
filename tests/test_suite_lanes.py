"""What scripts/test.sh relies on to run the suite in lanes: a lane told to stop tears its fixtures down,
and the list of the slowest tests is read from every lane's report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from conftest import REPO

SLEEPER = '''
import time
import pytest

@pytest.fixture
def lab(tmp_path_factory):
    yield
    (OUT / "tearing down").write_text("yes")
    time.sleep(1)  # a lab's removal takes a while
    (OUT / "torn down").write_text("yes")

def test_sleeps(lab):
    (OUT / "started").write_text("yes")
    try:
        time.sleep(60)
    except KeyboardInterrupt:  # as a tflab run in this process takes it, for its own Ctrl-C (exit 130)
        pytest.fail("interrupted")

def test_never_reached():
    (OUT / "second test").write_text("yes")
'''


def start_lane(tmp_path: Path, *, background: bool) -> subprocess.Popen:
    """A pytest session with this suite's conftest, as test.sh starts a lane (SIGINT ignored when in the background)."""
    (tmp_path / "test_sleeper.py").write_text(f"from pathlib import Path\nOUT = Path({str(tmp_path)!r})\n{SLEEPER}")
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                              "--rootdir", str(tmp_path), str(tmp_path / "test_sleeper.py")],
                             cwd=tmp_path, env={"PYTHONPATH": str(REPO / "tests"), "PATH": "/usr/bin:/bin"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()[0]
        time.sleep(0.1)
    return child


def test_a_lane_told_to_stop_by_sigterm_tears_its_fixtures_down_and_runs_nothing_more(tmp_path: Path) -> None:
    child = start_lane(tmp_path, background=False)
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 2, out  # pytest's "interrupted"
    assert "Interrupted: stopped by signal 15" in out
    assert (tmp_path / "torn down").read_text() == "yes"
    assert not (tmp_path / "second test").exists()


def test_a_lane_started_in_the_background_still_takes_a_ctrl_c_and_a_second_signal_cuts_no_teardown(
        tmp_path: Path) -> None:
    child = start_lane(tmp_path, background=True)  # SIGINT ignored, as bash leaves it for a job run with &
    child.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 30
    while not (tmp_path / "tearing down").exists():
        assert time.monotonic() < deadline, "a Ctrl-C did not stop the test"
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)  # test.sh's own, while the labs are being removed
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 2, out
    assert (tmp_path / "torn down").read_text() == "yes"
    assert not (tmp_path / "second test").exists()


REPORT = '''<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="{n}">{cases}</testsuite>
</testsuites>'''


def report(path: Path, cases: list[tuple]) -> Path:
    """A JUnit report of (class, name, time) or (class, name, time, the host's CPU seconds) cases."""
    def case(c: str, n: str, t: float, *cpu: float) -> str:
        properties = f'<properties><property name="host_cpu_s" value="{cpu[0]}" /></properties>' if cpu else ""
        return f'<testcase classname="{c}" name="{n}" time="{t}">{properties}</testcase>'
    path.write_text(REPORT.format(n=len(cases), cases="".join(case(*c) for c in cases)))
    return path


def test_the_slowest_tests_are_listed_over_every_lane_with_the_lane_each_ran_in(tmp_path: Path) -> None:
    beside = report(tmp_path / "beside.xml", [("tests.test_docker_run", "test_async", 48.4, 80.2),
                                              ("tests.test_docker_lab", "test_two_labs", 6.0, 9.5)])
    waits = report(tmp_path / "waits.xml", [("tests.test_docker_slurm", "test_slurm", 155.6),
                                              ("tests.test_k8s.TestManifests", "test_valid[ps]", 0.25, 0.3)])
    shown = subprocess.run([sys.executable, str(REPO / "scripts" / "slowest.py"), "3", str(beside), str(waits),
                            str(tmp_path / "alone.xml")], capture_output=True, text=True, check=True).stdout
    assert shown.splitlines() == [
        "test: the 3 slowest tests (setup, call and teardown; the host's CPU time over them; the lane each ran in):",
        "   155.6s              waits    tests/test_docker_slurm.py::test_slurm",
        "    48.4s    80.2s cpu  beside   tests/test_docker_run.py::test_async",
        "     6.0s     9.5s cpu  beside   tests/test_docker_lab.py::test_two_labs",
    ]



def test_the_lanes_are_shown_as_they_ran_from_the_first_ones_start(tmp_path: Path) -> None:
    """CI shows a run's last lines: they say when each lane ran, and on how many CPUs."""
    def lane(name: str, start: str, seconds: float) -> Path:
        path = report(tmp_path / f"{name}.xml", [("tests.test_docker_run", f"test_{name}", seconds)])
        path.write_text(path.read_text().replace('<testsuite name="pytest"',
                                                 f'<testsuite name="pytest" time="{seconds}" timestamp="{start}"'))
        return path

    reports = [lane("unit", "2026-11-29T07:00:05.5+00:00", 219.4), lane("swarm", "2026-11-29T07:03:52+00:00", 465.0),
               lane("alone", "2026-11-29T07:30:00+00:00", 425.4)]
    shown = subprocess.run([sys.executable, str(REPO / "scripts" / "slowest.py"), "1", *map(str, reports)],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert shown[2].startswith("test: the lanes, in seconds from the first one's start (CPUs: ")
    assert f"{os.cpu_count()} online" in shown[2], shown
    assert shown[3:] == ["      unit      0 to    219 (219 s)",
                         "     swarm    226 to    692 (465 s)",
                         "     alone   1794 to   2220 (425 s)"]

BURNER = '''
import time
import pytest

def burn(seconds):
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass

@pytest.fixture
def busy_teardown():
    yield
    burn(0.6)

def test_burns(busy_teardown):
    burn(0.6)
'''


def test_each_test_s_report_holds_the_host_s_cpu_time_over_its_setup_call_and_teardown(tmp_path: Path) -> None:
    (tmp_path / "test_burner.py").write_text(BURNER)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                           "--rootdir", str(tmp_path), "--junitxml", str(tmp_path / "r.xml"),
                           str(tmp_path / "test_burner.py")], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(REPO / "tests"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout
    [case] = ET.parse(tmp_path / "r.xml").getroot().iter("testcase")
    [cpu] = [float(p.get("value")) for p in case.iter("property") if p.get("name") == "host_cpu_s"]
    assert case.get("name") == "test_burns" and cpu >= 1.1, cpu  # this process alone used 1.2 s; the host, as much


def test_a_read_that_waits_for_a_line_never_printed_ends_at_its_timeout() -> None:
    from conftest import killed_after

    child = subprocess.Popen(["sh", "-c", "echo one; sleep 60"], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)  # as the tests start tflab; its sleep holds the pipe too
    began = time.monotonic()
    with killed_after(child, 1.0):
        lines = list(iter(child.stdout.readline, ""))
    assert lines == ["one\n"] and time.monotonic() - began < 10
    assert child.wait(timeout=10) == -signal.SIGKILL


FAKE_TFLAB = '''
import signal, sys, time
from pathlib import Path
out = Path(__file__).parent
def unwind(signum, frame):
    (out / "told").write_text(str(signum))
    sys.exit(130)
signal.signal(signal.SIGTERM, unwind)
(out / "building").write_text("yes")
time.sleep(60)
'''


def test_the_suite_s_base_build_passes_a_sigterm_on_to_tflab_base(tmp_path: Path) -> None:
    """test.sh stops its build with SIGTERM to suite_base.py (`pkill -P`): `tflab base`, which unwinds on it
    (its container and tree removed), must get it too, and the build end as failed."""
    fake = tmp_path / "tflab"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(FAKE_TFLAB)
    child = subprocess.Popen([sys.executable, str(REPO / "tests" / "suite_base.py"), str(tmp_path / "base.json")],
                             cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (fake / "building").exists():
        assert child.poll() is None and time.monotonic() < deadline, child.communicate()
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=30)
    assert (fake / "told").read_text() == str(int(signal.SIGTERM))
    assert child.returncode == 1 and err.startswith("suite_base: tflab base failed"), (out, err)
    assert not (tmp_path / "base.json").exists()


def test_the_waiting_lane_starts_with_its_modules_that_use_one_core() -> None:
    """test.sh's waiting lane, as collected: the late workers, the guard's tests beside a training lab, the Slurm
    cluster, the stopped sweep and the wheel first (they leave the training lane beside them a core), each
    module's tests in the order they are written; the training lane keeps its order; the measured sweep stays in
    the lane with nothing beside it."""
    def collected(markers: str) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                               markers], cwd=REPO, capture_output=True, text=True, check=True)
        return [line for line in done.stdout.splitlines() if "::" in line]

    waiting = collected("docker and waits and not swarm and not alone and not builds")
    modules = [test.split("::")[0] for test in waiting]
    light = ["tests/test_docker_late_worker.py"] * 2 + ["tests/test_docker_signals.py", "tests/test_docker_slurm.py",
                                                        "tests/test_docker_sweep.py"] + ["tests/test_wheel.py"] * 2
    assert modules[:7] == light, waiting
    assert waiting[7:] and not set(light) & set(modules[7:]), waiting
    assert waiting[5:7] == ["tests/test_wheel.py::test_the_wheel_carries_every_file_tflab_needs",
                            "tests/test_wheel.py::test_the_four_commands_verbatim_from_an_empty_folder"]
    training = [test.split("::")[0] for test in collected("docker and not waits and not swarm and not alone")]
    assert training[0] == "tests/test_docker_drills.py" and training == sorted(training), training
    alone = collected("docker and alone")
    assert "tests/test_docker_sweep.py::test_a_sweep_runs_every_point_and_writes_what_it_found" in alone
    assert not [test for test in alone if "stopped_sweep" in test]
