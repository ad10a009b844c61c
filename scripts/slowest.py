"""The N slowest tests over pytest's JUnit reports (scripts/test.sh runs the suite in lanes, one report each),
then when each lane ran and the CPUs it ran on (CI shows a run's last lines: where its time went).

    python scripts/slowest.py 15 unit.xml training.xml waits.xml alone.xml

Each test's time is its setup, call and teardown (pytest's default for these reports), and beside it
the CPU time the whole host spent over them (tests/conftest.py records it: two cores give at most twice
the time; a test far below its time mostly waited). A report that is missing (its lane did not run) is
passed over. Each line names the lane the test ran in:
with TFLAB_TESTS_LANES=2 the lanes `training` and `waits` run at the same time, and their tests' times include sharing the
host's two cores with the other lane.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from datetime import datetime
from pathlib import Path


def timings(report: Path) -> list[tuple[float, str, float | None]]:
    """(seconds, module::test, the host's CPU seconds or None) of every test case in one report."""
    return [(float(case.get("time", 0)), node_id(case.get("classname", ""), case.get("name", "")), host_cpu(case))
            for case in ET.parse(report).getroot().iter("testcase")]


def host_cpu(case: ET.Element) -> float | None:
    found = case.find("properties/property[@name='host_cpu_s']")
    return float(found.get("value")) if found is not None else None


def node_id(classname: str, name: str) -> str:
    """pytest's own name of a test (tests/test_x.py::Class::test) from a report's dotted class name."""
    parts = classname.split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    return "::".join(["/".join(parts[:module + 1]) + ".py", *parts[module + 1:], name])


def span(report: Path) -> tuple[datetime, float] | None:
    """When a lane's pytest began and how long it ran (its report's testsuite), where the report says."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    if suite is None or not suite.get("timestamp"):
        return None
    try:
        return datetime.fromisoformat(suite.get("timestamp", "")), float(suite.get("time", 0))
    except ValueError:
        return None


def cpus() -> str:
    """The CPUs the suite ran on: online, this process's, and a CPU quota over it (cgroup v2 or v1)."""
    said = f"{os.cpu_count()} online, {len(os.sched_getaffinity(0))} for this process"
    for path, period in (("/sys/fs/cgroup/cpu.max", None), ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
                                                            "/sys/fs/cgroup/cpu/cpu.cfs_period_us")):
        try:
            fields = Path(path).read_text().split()
            quota, every = fields[0], (fields[1] if period is None else Path(period).read_text().strip())
        except (OSError, IndexError):
            continue
        if quota not in ("max", "-1"):
            said += f", a quota of {int(quota) / int(every):g}"
        break
    return said


def main(argv: list[str]) -> int:
    count, reports = int(argv[0]), [Path(a) for a in argv[1:]]
    rows = [(seconds, name, report.stem, cpu) for report in reports if report.is_file()
            for seconds, name, cpu in timings(report)]
    if not rows:
        return 0
    print(f"test: the {min(count, len(rows))} slowest tests (setup, call and teardown; the host's CPU time over "
          "them; the lane each ran in):")
    for seconds, name, lane, cpu in sorted(rows, key=lambda row: row[0], reverse=True)[:count]:
        used = f"{cpu:7.1f}s cpu" if cpu is not None else " " * 11
        print(f"{seconds:8.1f}s {used}  {lane:<8} {name}")
    spans = {report.stem: found for report in reports if report.is_file() and (found := span(report))}
    if spans:
        first = min(start for start, _ in spans.values())
        print(f"test: the lanes, in seconds from the first one's start (CPUs: {cpus()}):")
        for lane, (start, seconds) in sorted(spans.items(), key=lambda item: item[1][0]):
            begun = (start - first).total_seconds()
            print(f"{lane:>10} {begun:6.0f} to {begun + seconds:6.0f} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
