"""Where a node waits, on real containers: py-spy's dump of its program read before anything is said of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, cli
from test_docker_run import add_tasks, task_processes

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.waits]

SERVE = "exec python /workspace/serve_only.py"


@pytest.fixture(scope="module")
def chief_lab(module_labs) -> Path:
    """ps0, worker0, worker1 and a chief, with tests/programs."""
    lab = module_labs.gen("--chief", nodes=3, code=REPO / "tests" / "programs")
    add_tasks(lab, {
        "smoke": f"sh -c 'case {{job_name}} in chief) sleep 3; echo the chief is done;; *) {SERVE};; esac'",
        "retries": f"sh -c 'case {{job_name}} in ps) {SERVE};; *) exec python /workspace/retry_loop.py;; esac'",
    })
    up = CliRunner(mix_stderr=False).invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    return lab


def test_a_chief_lab_whose_workers_only_serve_ends_ok(chief_lab: Path, runner, docker_client) -> None:
    """The operator's smoke test: the chief succeeds, the workers serve (Server.join()). A TFJob ends it as a success;
    so does tflab, the workers `served` from their stacks, never `hung`, and no device_filters cure."""
    result = runner.invoke(cli, ["run", "smoke", "--grace", "3", "--lab", str(chief_lab)])
    text = result.stdout.replace("\n", " ")
    assert result.exit_code == 0, result.stdout[-3000:]
    for worker in ("worker0", "worker1"):
        assert re.search(rf"{worker} serves: it waits in TensorFlow's Server\.join\(\) \(Server\.join "
                         r"\(server_lib\.py:\d+\) ← <module> \(serve_only\.py:14\)\)", text), text[-3000:]
        assert f"{worker} served: it never trained" in text and "`servers: [ps, worker]`" in text
    assert "hung" not in text and "device_filters" not in text
    report = json.loads((chief_lab / "runs" / "smoke" / "run.json").read_text())
    assert report["verdict"] == "ok"
    assert {n: report["nodes"][n]["verdict"] for n in ("chief", "worker0", "worker1", "ps0")} == {
        "chief": "ok", "worker0": "served", "worker1": "served", "ps0": "served"}
    assert "Server.join" in report["nodes"]["worker0"]["stack"]
    assert task_processes(docker_client, labfiles.open_lab(chief_lab).project) == {}


def test_a_program_asleep_in_its_own_retry_loop_is_shown_with_its_stack_and_no_false_cause(
        chief_lab: Path, runner, docker_client) -> None:
    result = runner.invoke(cli, ["run", "retries", "--stall", "20", "--lab", str(chief_lab)])
    text = result.stdout.replace("\n", " ")
    assert result.exit_code == 1, result.stdout[-3000:]
    assert "the run is stalled" in text
    for node in ("chief", "worker0", "worker1"):
        assert re.search(rf"where: {node} waits in the program's own code: "
                         r"with_retries\.<locals>\.wrap\.<locals>\.wrapped \(retry_loop\.py:\d+\) ← main "
                         r"\(retry_loop\.py:\d+\)", text), text[-3000:]
    assert "TF_CONFIG" not in text and "cluster list" not in text, "no guessed cause"
    assert "worker0 never joined: no node reaches worker0:2222" in text, "what the reachability check found"
    assert "cure: its stack shows what it does instead of making its strategy or server" in text
    report = json.loads((chief_lab / "runs" / "retries" / "run.json").read_text())
    assert report["verdict"] == "stalled"
    assert "retry_loop.py" in report["nodes"]["worker0"]["stack"]
    assert report["nodes"]["worker0"]["waits"].startswith("worker0 waits in the program's own code")
    log = (chief_lab / "runs" / "retries" / "logs" / "worker0.log").read_text()
    assert "--- tflab: where worker0 waits (py-spy dump) ---" in log and "retry_loop.py" in log
    assert task_processes(docker_client, labfiles.open_lab(chief_lab).project) == {}


def test_an_exec_alone_of_a_task_whose_peers_no_exec_runs_is_stalled_naming_them(labs, runner) -> None:
    """`tflab exec worker0 allreduce` on a two-worker all-reduce lab, and no exec of worker1: worker0 waits for it in
    silence (it waited 172 s, until Ctrl-C). It stalls, naming worker1 and the command that starts it."""
    lab = labs.gen("--ps", "0", nodes=2)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    result = runner.invoke(cli, ["exec", "--lab", str(lab), "worker0", "allreduce", "--stall", "15"])
    text = " ".join((result.stdout + result.stderr).split())
    assert result.exit_code == 1, text[-3000:]
    assert "stalled" in text and ("worker1 runs no exec of allreduce, and this one waits for it: `tflab exec worker1 "
                                  "allreduce` in another terminal starts worker1, or `tflab run allreduce` runs them "
                                  "all") in text, text[-3000:]
