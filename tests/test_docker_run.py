"""`tflab run` on a real 4-node CPU lab with the examples: order, verdicts, clean stops."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO, cli

from tflab.engine.containers import lab_containers
from tflab.engine.executors import exec_quiet
from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow]
NOISE = ("I0000", "W0000", "E0000")


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The examples' default data, prepared on the host as a user would."""
    data = tmp_path_factory.mktemp("data")
    subprocess.run([sys.executable, str(REPO / "examples" / "prepare_data.py"), str(data)], check=True)
    return data


def add_tasks(lab: Path, tasks: dict) -> None:
    """Add tasks to a lab's tflab.yaml, as a user editing it would."""
    path = lab / "tflab.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["tasks"].update(tasks)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def shorten(lab: Path, task: str, steps: int) -> None:
    """A task of the examples trained for `steps` steps, as a user edits tflab.yaml when a run needs an end."""
    path = lab / "tflab.yaml"
    doc = yaml.safe_load(path.read_text())
    spec = doc["tasks"][task]
    if isinstance(spec, str):
        doc["tasks"][task] = f"{spec} --train_steps={steps}"
    else:
        spec["command"] = f"{spec['command']} --train_steps={steps}"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


SWEEP = ("for f in /run/tflab/run:*.pid /run/tflab/exec:*.pid /run/tflab/serve:*.pid; "
         "do [ -f \"$f\" ] && cut -d' ' -f1 \"$f\"; done; echo --; ps -eo pid=,stat=,args=")


def task_processes(client, project: str) -> dict[str, str]:
    """Every node's processes but its own: init, sshd, an exec being set up.

    A process already
    exiting (its memory gone: `ps` shows its name in brackets) is looked at again a moment later:
    a guard that has just told tflab its program's end may still be on its way out, a leak is not.
    """
    left = _task_processes(client, project)
    for _ in range(10):
        if not any(args.startswith("[") for listed in left.values() for args in listed.split("; ")):
            break
        time.sleep(0.5)
        left = _task_processes(client, project)
    return left


def _task_processes(client, project: str) -> dict[str, str]:
    left = {}
    for name, container in lab_containers(client, project).items():
        if container.status != "running":
            continue  # a stopped node runs nothing
        _, out = exec_quiet(client, container, ["sh", "-c", SWEEP])
        _, listing = out.split("--\n", 1)
        rest = []
        for line in listing.splitlines():
            pid, state, args = (line.split(None, 2) + ["", ""])[:3]
            if state.startswith("Z"):
                continue  # exited, not yet reaped by its parent: it runs nothing
            # sshd's own: the daemon, and the child it forks for each connection (an ssh session's)
            if not args or args.startswith(("/sbin/docker-init", "sshd", "/usr/sbin/sshd", "ps -eo", "sh -c for f in",
                                            "runc init")):
                continue
            if args.startswith("python3 /usr/local/share/tflab/guard.pyz") and (
                    {"ended", "delivered"} & set(args.split())):
                continue  # tflab asking how a process ended, or telling the node it read all its output
            if args.startswith("tflab-guard serve tensorboard") or "tensorboard --logdir /runs" in args or (
                    "/tensorboard_data_server/bin/server " in args and "--logdir=/runs " in args):
                continue  # the lab's TensorBoard (every run starts it where none serves) and its data server: no task's
            rest.append(f"{args} ({pid} {state})" if args.startswith("[") else args)
        if rest:
            left[name] = "; ".join(rest)
    return left


def lines_of(output: str, node: str) -> list[str]:
    return [line[len(node) + 3:] for line in output.splitlines() if line.startswith(f"[{node}] ")]


def run_and_kill_worker1(lf, client, run_args: list[str], marker: str, timeout: float):
    """`tflab run` as a user starts it; once `marker` is printed, worker1's training is killed.

    Returns the finished process, all it printed, and when the kill happened."""
    child = subprocess.Popen([sys.executable, "-m", "tflab", "run", *run_args, "--lab", str(lf.root)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    assert child.stdout is not None
    for line in child.stdout:
        output.append(line)
        if line.startswith(marker):
            break
    killed_at = time.monotonic()
    worker1 = lab_containers(client, lf.project)["worker1"]
    assert exec_quiet(client, worker1, ["pkill", "-9", "-f", "mnist_async.py"])[0] == 0
    rest, _ = child.communicate(timeout=timeout)
    return child, "".join(output) + rest, killed_at


@pytest.fixture(scope="module")
def ps_lab(module_labs, digits) -> Path:
    """ps0 and three workers with the examples, shared by the module's tests: each adds a task of its own (only
    the first reruns `train`) and ends asserting that no task process is left in any node."""
    lab = module_labs.gen(nodes=4, code=REPO / "examples", data=digits)
    up = CliRunner(mix_stderr=False).invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    return lab


def execs_of(client, project: str, since: float, until: float) -> list[tuple[str, str]]:
    """The `docker exec`s made in a lab's containers between two times, from the engine's own events: (node, the
    guard's verb or the command). The engine's own healthchecks (sshd listening, every 30 s) are not tflab's."""
    made = client.events(since=int(since), until=int(until) + 1, decode=True,
                         filters={"type": "container", "event": "exec_create",
                                  "label": f"com.docker.compose.project={project}"})
    execs = []
    for event in made:
        if not since * 1e9 <= event["timeNano"] <= until * 1e9:  # the engine's since/until are whole seconds
            continue
        command = event["Action"].split(": ", 1)[-1]
        health = (client.containers.get(event["id"]).attrs["Config"].get("Healthcheck") or {}).get("Test") or []
        if health[:1] == ["CMD"] and command.split() == " ".join(health[1:]).split():
            continue
        words = command.split()
        verb = words[2] if words[:2] == ["python3", "/usr/local/share/tflab/guard.pyz"] and len(words) > 2 else words[0]
        execs.append((event["Actor"]["Attributes"].get("com.docker.compose.service", "?"), verb))
    return execs


def test_async_training_ends_with_accuracy_checkpoint_and_no_ps_left(ps_lab: Path, runner, docker_client) -> None:
    lf = labfiles.open_lab(ps_lab)
    since = time.time()
    result = runner.invoke(cli, ["run", "train", "--lab", str(ps_lab)])
    assert result.exit_code == 0, result.stdout[-3000:]
    # Each process's ending comes in the trip that started it: a run makes a node's process, the ps's readiness
    # probe, each node's metrics, and the lab's TensorBoard where none serves yet, and nothing more (26 docker execs
    # before the end line: 8 on the ps, 6 on each worker, several of them to learn one ending in two more trips).
    execs = execs_of(docker_client, lf.project, since, time.time())
    assert len(execs) <= 11, sorted(execs)
    out = result.stdout
    # Order: the ps served before any worker started.
    assert out.index("tflab: ps0 is serving on ps0:2222") < out.index("tflab: starting worker0, worker1, worker2")
    accuracy = [line for line in lines_of(out, "worker0") if "test accuracy" in line]
    assert accuracy and float(accuracy[-1].split()[-1]) >= 0.9, accuracy
    summary = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert "served" in summary["ps0"] and all(" ok " in summary[w] for w in ("worker0", "worker1", "worker2"))
    run_dir = lf.runs_dir / "train"
    final = Path((run_dir / "checkpoint").read_text().splitlines()[0].split('"')[1]).name
    for suffix in (".index", ".meta", ".data-00000-of-00001"):
        assert (run_dir / f"{final}{suffix}").is_file(), f"{final}{suffix} missing"
    assert (run_dir / "logs" / "worker1.log").read_text().count("global step") >= 1
    assert task_processes(docker_client, lf.project) == {}
    shown = runner.invoke(cli, ["logs", "worker1", "--lab", str(ps_lab)])  # the latest run's program output
    assert shown.exit_code == 0 and "worker1 | worker1: global step" in shown.stdout, shown.stdout[-2000:]
    assert "kex_exchange" not in shown.stdout and "sshd" not in shown.stdout
    # Its pictures: the trace at once, the timeline and the page a moment later; the page, in a browser, is no
    # blank page (issue 65).
    assert f"report: {run_dir / 'report.html'}" in " ".join(out.split())
    trace = json.loads((run_dir / "trace.json").read_text())
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"} == {
        "ps0 (serves)", "worker0 (trains)", "worker1 (trains)", "worker2 (trains)"}
    deadline = time.monotonic() + 60
    while not (run_dir / "report.html").is_file() and time.monotonic() < deadline:
        time.sleep(0.5)
    from test_docker_tensorboard import OUTPUT, chromium

    OUTPUT.mkdir(exist_ok=True)
    shot = OUTPUT / "run-report.png"
    subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1200", f"--screenshot={shot}", (run_dir / "report.html").as_uri()],
                   capture_output=True, timeout=120, check=True)
    import matplotlib.image

    assert matplotlib.image.imread(shot).std() > 0.05, "the page shows something"
    assert "run train: ok" in (run_dir / "report.html").read_text()

    # A second run starts clean: the previous outputs are moved aside, nothing stale is read. It and the
    # resume need an end, not an accuracy: the user shortens the task in tflab.yaml.
    shorten(ps_lab, "train", 200)
    again = runner.invoke(cli, ["run", "train", "--lab", str(ps_lab)])
    assert again.exit_code == 0, again.stdout[-3000:]
    assert "worker0: starting fresh in /runs/train" in again.stdout
    previous = [p for p in lf.runs_dir.iterdir() if p.name.startswith("train.")]
    assert len(previous) == 1 and (previous[0] / "checkpoint").is_file()
    resumed = runner.invoke(cli, ["run", "train", "--lab", str(ps_lab), "--resume"])
    assert resumed.exit_code == 0, resumed.stdout[-3000:]
    assert "worker0: resuming from /runs/train/model.ckpt-" in resumed.stdout


@pytest.mark.alone  # timed: reported between 33 and 75 s
def test_hung_worker_is_reported_and_stopped(ps_lab: Path, runner, docker_client) -> None:
    add_tasks(ps_lab, {"hang": "sh -c 'if [ {node} = worker2 ]; then sleep 600; fi; "
                               "if [ {job_name} = ps ]; then python -m http.server 2222; fi'"})
    started = time.monotonic()
    result = runner.invoke(cli, ["run", "hang", "--grace", "3", "--lab", str(ps_lab)])
    assert result.exit_code == 1
    # Never a step: it may sleep through TF's 30 s recovery wait, so it gets that much more.
    assert 33 <= time.monotonic() - started < 75
    text = " ".join(result.stdout.split())
    said = re.search(r"tflab: worker2 never printed a training step and still waited (\d+)s after the chief finished "
                     r"\(where it waits could not be read\): reported hung and stopped", text)
    assert said, "no guessed cause: it is no Python program"
    assert 33 <= int(said.group(1)) < 45, "its grace and TF's 30 s recovery wait, and the moment its stack is read"
    assert "tflab: where worker2 waits could not be read: no Python process to read: it runs sh -c" in text
    assert "device_filters" not in text
    worker2 = next(line for line in result.stdout.splitlines() if line.startswith("│ worker2"))
    assert "hung" in worker2
    assert task_processes(docker_client, labfiles.open_lab(ps_lab).project) == {}


def test_two_workers_failing_at_once_are_both_failed(ps_lab: Path, runner, docker_client) -> None:
    """worker1 and worker2 fail together (each ignores the SIGTERM of the run's end, so each ends by itself): both are
    `failed` with exit code 1, whichever ended the run; the chief, which tflab stopped, is `stopped`."""
    add_tasks(ps_lab, {"both_fail": "sh -c 'if [ {job_name} = ps ]; then exec python -m http.server 2222; fi; "
                                    "if [ {node} = worker0 ]; then exec sleep 60; fi; trap \"\" TERM; sleep 2; exit 1'"})
    result = runner.invoke(cli, ["run", "both_fail", "--lab", str(ps_lab)])
    assert result.exit_code == 1, result.stdout[-2000:]
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│ ")}
    for worker in ("worker1", "worker2"):
        assert "failed" in rows[worker] and "stopped" not in rows[worker], rows[worker]
    assert "stopped" in rows["worker0"], rows["worker0"]
    report = json.loads((ps_lab / "runs" / "both_fail" / "run.json").read_text())
    assert {n: (report["nodes"][n]["verdict"], report["nodes"][n]["exit_code"]) for n in ("worker1", "worker2")} == \
        {"worker1": ("failed", 1), "worker2": ("failed", 1)}
    assert task_processes(docker_client, labfiles.open_lab(ps_lab).project) == {}


@pytest.mark.alone  # timed: the run ends within 60 s of the kill
def test_killed_worker_fails_the_run_fast_and_stops_the_rest(ps_lab: Path, docker_client) -> None:
    lf = labfiles.open_lab(ps_lab)
    add_tasks(ps_lab, {"long": "python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} "
                               "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --train_steps=10000000"})
    child, text, killed_at = run_and_kill_worker1(
        lf, docker_client, ["long"], "[worker1] worker1: global step", timeout=120)
    assert child.returncode == 1, text[-3000:]
    assert time.monotonic() - killed_at < 60
    assert "tflab: worker1 failed with exit code 137 (killed by SIGKILL from outside tflab)" in text
    summary = {line.split("│")[1].strip(): line for line in text.splitlines() if line.startswith("│")}
    assert "failed" in summary["worker1"]
    assert all("stopped" in summary[n] or "served" in summary[n] for n in ("ps0", "worker0", "worker2"))
    assert task_processes(docker_client, lf.project) == {}


def test_allreduce_workers_agree_on_the_final_loss(labs, runner, digits, docker_client) -> None:
    lab = labs.gen("--ps", "0", nodes=4, code=REPO / "examples", data=digits)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    result = runner.invoke(cli, ["run", "allreduce", "--lab", str(lab)])
    assert result.exit_code == 0, result.stdout[-3000:]
    finals = {}
    for worker in ("worker0", "worker1", "worker2", "worker3"):
        line = next(l for l in lines_of(result.stdout, worker) if "final loss" in l)
        finals[worker] = line.split("final loss ")[1].split()[0]
        assert "4 replicas in sync" in "\n".join(lines_of(result.stdout, worker))
    assert len(set(finals.values())) == 1, finals


def test_parameter_server_strategy_with_a_chief(labs, runner, digits) -> None:
    lab = labs.gen("--chief", nodes=3, code=REPO / "examples", data=digits)
    assert runner.invoke(cli, ["up", "--lab", str(lab)]).exit_code == 0
    result = runner.invoke(cli, ["run", "ps_strategy", "--lab", str(lab)])
    assert result.exit_code == 0, result.stdout[-3000:]
    out = result.stdout
    assert out.index("tflab: worker1 is serving") < out.index("tflab: starting chief")
    accuracy = [l for l in lines_of(out, "chief") if "test accuracy" in l]
    assert accuracy and float(accuracy[-1].split()[-1]) >= 0.8


def test_a_failed_worker_is_restarted_when_asked_and_the_run_succeeds(ps_lab: Path, docker_client) -> None:
    lf = labfiles.open_lab(ps_lab)
    add_tasks(ps_lab, {"medium": "python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} "
                                 "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --log_dir={run_dir} --train_steps=6000"})
    child, text, _ = run_and_kill_worker1(
        lf, docker_client, ["medium", "--restarts", "1"], "[worker1] worker1: first step done", timeout=300)
    assert child.returncode == 0, text[-3000:]
    assert "tflab: worker1 exited with 137 (killed by SIGKILL from outside tflab); restart 1 of 1" in text, text[-3000:]
    worker1_row = next(line for line in text.splitlines() if line.startswith("│ worker1"))
    assert "ok (attempt 2)" in worker1_row
    assert task_processes(docker_client, lf.project) == {}
