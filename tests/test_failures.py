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
def test_each_failure_finds_every_line_it_was_seen_in_and_none_of_its_near_misses(failure: failures.Failure) -> None:
    for seen, where in failure.seen:
        assert where, seen
        assert failures.diagnose(["some output before it", *seen.split("\n"), "and after"]) is failure, \
            f"{seen!r}: not found, or an entry before it finds it (the catalog's order)"
    for unlike in failure.unlike:
        assert not failure.finds(unlike), unlike
        assert failures.diagnose([unlike]) is None, unlike


# Entries seen in one program so far, where a second could not be made here: Keras 3's failures of two corpus
# programs' own, NCCL's /dev/shm (GPUs), a restore of another model, gRPC's give-up (here it retries on and on).
ONE_SOURCE = ("keras3-per-replica", "keras3-parameter-server", "restored-another-model", "dev-shm-full",
              "peer-unreachable")
BY_CAUSE = tuple(f.id for f in CATALOG if f.id not in ONE_SOURCE)


@pytest.mark.parametrize("failure_id", BY_CAUSE)
def test_an_entry_by_cause_was_seen_in_two_programs_or_versions_at_least(failure_id: str) -> None:
    failure = next(f for f in CATALOG if f.id == failure_id)
    assert len({where for _line, where in failure.seen}) >= 2, failure.seen


def test_a_tf1_savers_checkpoint_failure_over_two_lines_is_the_checkpoint_on_one_machine() -> None:
    """TF1's Saver prints its op's name on the line after the message; TF2's gRPC error carries both in one."""
    tf1 = ["tensorflow.python.framework.errors_impl.NotFoundError: Graph execution error:", "",
           "Detected at node 'save/SaveV2' defined at (most recent call last):", "Node: 'save/SaveV2'",
           "/tmp/train_logs/model.ckpt-0_temp/part-00001-of-00002; No such file or directory",
           "\t [[{{node save/SaveV2}}]]"]
    assert failures.diagnose(tf1).id == "checkpoint-on-one-machine"
    far = ["/tmp/x; No such file or directory", "a", "b", "c", "\t [[{{node save/SaveV2}}]]"]
    assert failures.diagnose(far) is None, "lines apart are not one message"


def test_the_catalog_knows_the_failures_design_names() -> None:
    ids = [f.id for f in CATALOG]
    assert len(ids) == len(set(ids)) >= 8
    for named in ("keras3-per-replica", "no-tf-keras", "checkpoint-on-one-machine", "collective-ops-startup",
                  "port-in-use", "dev-shm-full", "peer-unreachable", "restored-another-model", "keras2-only-symbol",
                  "estimator-gone"):
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
