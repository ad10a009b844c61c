"""`tflab render slurm` on a real Slurm cluster (Debian's slurmctld, slurmd and munge in containers, made by
scripts/slurm_cluster.py): the rendered script trains the examples, ends COMPLETED or FAILED with the workers'
code, and leaves no process on any compute node; the same tflab.yaml as a lab gives the same result line."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import REPO, cli, node_image_of
from test_docker_run import add_tasks

from tflab.host import labfiles

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.waits]
FIXTURE = [sys.executable, str(REPO / "scripts" / "slurm_cluster.py")]
HANG = ("if [ {job_name} = ps ]; then exec python -m http.server ${TFLAB_PS_HOSTS##*:}; fi; "
        "if [ {task_index} = 1 ]; then exec sleep 600; fi; echo 'done here'")
FAIL = ("if [ {job_name} = ps ]; then exec python -m http.server ${TFLAB_PS_HOSTS##*:}; fi; "
        "if [ {task_index} = 1 ]; then echo 'worker1 gives up'; exit 7; fi; sleep 600")
ACCURACY = re.compile(r"test accuracy (0\.\d+)")
# A job's end, seen on the controller within half a second. Not `sbatch --wait`: it asks after 2, 8, then every
# 32 s (its interval grows while it is under a third of MinJobAge, 3600 s here as by default), so a job of 11 s
# was seen at 42 s, one of 43 s at 74 s. Until a final state: a query the loaded controller does not answer
# is asked again (slurm()'s timeout bounds the wait).
ENDED = ("until scontrol -o show job {job} | grep -Eq 'JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL"
         "|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE) '; do sleep 0.5; done")


def slurm(name: str, *argv: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*FIXTURE, "exec", "--name", name, *(["--cwd", str(cwd)] if cwd else []), "--", *argv],
                          capture_output=True, text=True, timeout=timeout)


def job_state(name: str, job: str) -> tuple[str, str]:
    shown = slurm(name, "scontrol", "show", "job", job).stdout
    return re.search(r"JobState=(\S+)", shown).group(1), re.search(r"\bExitCode=(\S+)", shown).group(1)


def submit(name: str, lab: Path, *render: str) -> tuple[str, str, str]:
    """Render the lab's script, sbatch it from the lab folder and wait: (job id, its output, its state)."""
    script = lab / "job.sh"
    rendered = subprocess.run([sys.executable, "-m", "tflab", "render", "slurm", "--lab", str(lab), "-o", str(script),
                               *render], capture_output=True, text=True)
    assert rendered.returncode == 0, rendered.stderr
    done = slurm(name, "sbatch", "--parsable", script.name, cwd=lab)
    job = done.stdout.strip().split(";")[0]
    assert job.isdigit(), done.stdout + done.stderr
    ended = slurm(name, "sh", "-c", ENDED.format(job=job))
    assert ended.returncode == 0, ended.stdout + ended.stderr
    output = next(lab.glob(f"slurm-*-{job}.out")).read_text()
    state, code = job_state(name, job)
    return job, output, f"{state} {code}"


def left_on_nodes(name: str, nodes: int) -> dict[str, list[str]]:
    """Every compute node's processes but its own daemons."""
    left = {}
    for i in range(1, nodes + 1):
        listing = subprocess.run(["docker", "exec", f"{name}-c{i}", "ps", "-eo", "stat=,args="], capture_output=True,
                                 text=True).stdout.splitlines()
        rest = [line for line in listing if not line.startswith("Z") and not re.search(
            r"docker-init|munged|slurmd|sh -c printf|ps -eo", line)]
        if rest:
            left[f"c{i}"] = rest
    return left


@pytest.fixture
def cluster(labs, runner):
    """A Slurm cluster of four compute nodes sized as a 4-node lab's nodes, the labs' folder shared; and the lab."""
    lab = labs.gen(nodes=4)
    add_tasks(lab, {"fail": FAIL, "hang": HANG})
    # its node image, built as `up` builds it (no node of it runs: the jobs run on the cluster's)
    built = runner.invoke(cli, ["build", "--lab", str(lab)])
    assert built.exit_code == 0, built.stdout + built.stderr
    image = node_image_of(built.stdout)
    lf = labfiles.open_lab(lab)
    memory = max(n.share.memory_mib or 0 for n in lf.lab.nodes) or 2048
    name = f"tflab-slurm-{uuid.uuid4().hex[:6]}"
    made = subprocess.run([*FIXTURE, "up", "--image", image, "--share", str(lab.parent), "--nodes", "4", "--cpus", "1",
                           "--memory", str(memory), "--name", name], capture_output=True, text=True, timeout=1800)
    try:
        assert made.returncode == 0, made.stdout + made.stderr
        yield name, lab, memory
    finally:
        subprocess.run([*FIXTURE, "down", "--name", name], capture_output=True, timeout=300)
        assert not subprocess.run(["docker", "ps", "-aq", "--filter", f"label=tflab.fixture.cluster={name}"],
                                  capture_output=True, text=True).stdout.strip(), "the cluster's containers are gone"


def test_the_rendered_job_trains_on_a_real_slurm_cluster_like_the_lab(cluster, labs) -> None:
    name, lab, memory = cluster

    # parameter server and three workers, classic flags through the placeholders
    job, output, state = submit(name, lab, "--task", "train")
    assert state == "COMPLETED 0:0", output
    assert "tflab: ps0 is serving on c1:" in output and "[worker2] worker2: done after" in output
    on_slurm = ACCURACY.search(output)
    assert on_slurm and float(on_slurm.group(1)) > 0.9, output
    # the result line as a lab's run prints it (the node's name, then the program's own line)
    assert re.search(r"^\[worker0\] worker0: test accuracy 0\.\d+$", output, re.MULTILINE), output
    assert (lab / "runs" / f"train-{job}" / "checkpoint").is_file(), "the checkpoint lands in the job's runs folder"
    assert left_on_nodes(name, 4) == {}

    # a failed worker ends the job FAILED with its code, and nothing is left running
    job, output, state = submit(name, lab, "--task", "fail")
    assert state == "FAILED 7:0", output
    assert "[worker1] worker1 gives up" in output and "tflab: worker1 failed (exit 7): the job stops the others" in output
    assert left_on_nodes(name, 4) == {}

    # a worker still running a grace after the chief finished is reported hung and stopped; the job fails
    job, output, state = submit(name, lab, "--task", "hang", "--grace", "3")
    assert state == "FAILED 1:0", output
    assert "tflab: worker1 still ran 3s after the chief finished: reported hung and stopped" in output
    assert left_on_nodes(name, 4) == {}

    # synchronous all-reduce: a lab of three workers (no parameter server) in the same shared folder
    ring = labs.gen("--ps", "0", "--memory-per-node", f"{memory}m", nodes=3)
    job, output, state = submit(name, ring, "--task", "allreduce")
    assert state == "COMPLETED 0:0", output
    assert "servers" not in output.split("\n", 1)[0] and ACCURACY.search(output), output
    assert float(ACCURACY.search(output).group(1)) > 0.9
    assert left_on_nodes(name, 4) == {}
