"""The catalog of known failures (tflab/run/failures.yaml): every entry finds the real line it was seen in and not
its near miss, the first entry that finds a line wins, a run's failed and stalled nodes are diagnosed from their
logs, and README's table is the catalog's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from tflab.run import failures

CATALOG = failures.catalog()


@pytest.mark.parametrize("failure", CATALOG, ids=[f.id for f in CATALOG])
def test_each_failure_finds_the_line_it_was_seen_in_and_not_its_near_miss(failure: failures.Failure) -> None:
    assert failure.finds(failure.seen), failure.seen
    assert failures.diagnose(["some output before it", failure.seen, "and after"]) is failure, \
        "an entry before it finds its line: the catalog's order"
    assert not failure.finds(failure.unlike), failure.unlike
    assert failures.diagnose([failure.unlike]) is None, failure.unlike
    assert failure.cause and failure.cure and failure.where


def test_the_catalog_knows_the_failures_design_names() -> None:
    ids = [f.id for f in CATALOG]
    assert len(ids) == len(set(ids)) >= 8
    for named in ("keras3-per-replica", "no-tf-keras", "checkpoint-on-one-machine", "collective-ops-startup",
                  "port-in-use", "dev-shm-full", "peer-unreachable", "restored-another-model"):
        assert named in ids


def test_a_failed_nodes_log_is_diagnosed_by_its_specific_failure_before_the_grpc_errors_it_caused(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "chief.log").write_text("\n".join([
        "Epoch 1/5",
        "  (0) NOT_FOUND:   /tmp/my_working_dir/ckpt/variables/variables_temp; No such file or directory",
        "Additional GRPC error information from remote target /job:ps/replica:0/task:1 while calling "
        "/tensorflow.WorkerService/RecvTensor:",
        ':UNKNOWN:Error received from peer  {grpc_message:"/tmp/my_working_dir/ckpt/variables/variables_temp; No '
        'such file or directory\\n\\t [[{{node SaveV2_1}}]]", grpc_status:5}',
        "  (1) UNAVAILABLE: failed to connect to all addresses",
    ]) + "\n")
    (logs / "worker0.log").write_text("training\n")
    found = failures.diagnose_nodes({"chief": "failed", "worker0": "failed", "ps0": "stopped"}, logs)
    assert {node: f.id for node, f in found.items()} == {"chief": "checkpoint-on-one-machine"}
    assert failures.diagnose_nodes({"ps1": "failed"}, logs) == {}, "no log: nothing to say"


def test_the_cause_and_cure_are_said_once_per_failure_naming_its_nodes() -> None:
    keras = failures.catalog()[0].as_dict()
    assert failures.said({"worker0": keras, "worker1": keras}) == [
        f"cause (worker0, worker1): {keras['cause']}", f"cure: {keras['cure']}"]


def test_readme_shows_the_catalog_as_it_is() -> None:
    assert failures.markdown_table() in (REPO / "README.md").read_text(), \
        "README's 'When a run fails' table is failures.markdown_table(): write it again from the catalog"
