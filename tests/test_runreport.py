"""run.json as one typed record: written and read back whole, a malformed one read as none."""

from __future__ import annotations

import json
from pathlib import Path

from tflab.run.runreport import RUN_FILE, NodeRow, RunReport, load


def test_a_report_is_read_back_as_it_was_written(tmp_path: Path) -> None:
    report = RunReport(task="train", state="finished", pid=42, host="h", started=1.5, ended=9.0, verdict="ok",
                       exit_code=0, result="worker0: test accuracy 0.97", steps_per_s=5.2, steady_steps_per_s=5.4,
                       limit={"kind": "link", "evidence": "ps0 sent 19 Mbit/s of its 20mbit link"},
                       knobs={"workers": 2}, cluster={"ps0": {"cpu": 0.5, "tx_mbit": 19.0, "rx_mbit": 3.0}},
                       faults=[{"fault": "pause worker1 at 5s for 2s"}],
                       nodes={"ps0": NodeRow("server", 1, None, "served"), "worker0": NodeRow("finisher", 1, 0, "ok")})
    report.save(tmp_path)
    assert load(tmp_path) == report
    assert json.loads((tmp_path / RUN_FILE).read_text())["nodes"]["worker0"]["exit_code"] == 0


def test_a_record_tflab_did_not_write_is_no_record(tmp_path: Path) -> None:
    def read(text: str) -> RunReport | None:
        (tmp_path / RUN_FILE).write_text(text)
        return load(tmp_path)

    assert read('{"task": "train", "state": "running", "pid": "42"}') is None
    assert read('{"task": "train", "state": "running", "steps_per_s": NaN}') is None
    assert read('{"task": "train", "state": "running", "nodes": {"w": {"role": "finisher", "attempt": "x"}}}') is None
    assert read('{"task": "train", "state": "running", "nodes": {"w": []}}') is None
    assert read('{"state": "running"}') is None
    assert read("[]") is None and read("{") is None
    kept = read('{"task": "train", "state": "running", "detached": true, "added_later": 1}')
    assert kept == RunReport(task="train", state="running", detached=True), "keys of another tflab are left out"
