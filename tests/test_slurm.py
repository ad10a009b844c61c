"""`tflab render slurm` without a cluster: the script's resources, order, commands and checks, and bash's parse."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import cli

from tflab.errors import UserError
from tflab.plan import config as cfg
from tflab.plan.gpus import Gpu
from tflab.plan.shares import HostFacts
from tflab.plan.topology import Topology, plan
from tflab.render import slurm

HOST = HostFacts(cpus=tuple(range(8)), memory_mib=32768)
CLASSIC = cfg.Task("train", "python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} "
                            "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --log_dir={run_dir} --data /data/x "
                            "--keep /database")


def lab_and_config(**topology) -> tuple:
    lab = plan(Topology(**topology), [Gpu(i, memory_mib=81559) for i in range(8)], HOST)
    return lab, cfg.LabConfig(name="demo", topology=lab.topology, host=HOST, tasks={"train": CLASSIC})


def test_the_script_asks_for_the_labs_nodes_and_keeps_its_order() -> None:
    lab, config = lab_and_config(nodes=4, gpus_per_node=2, cpus_per_node="2", memory_per_node="4g")
    text = slurm.render(config, lab, CLASSIC, partition="gpu", time_limit="1-02:00:00", account="ml")
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=2", "#SBATCH --mem=4096M",
                 "#SBATCH --gres=gpu:2", "#SBATCH --partition=gpu", "#SBATCH --time=1-02:00:00", "#SBATCH --account=ml"):
        assert line in text.splitlines(), line
    # servers first and waited on, then the workers; the chief decides the grace; the servers stopped at the end
    assert text.index("start ps0 ps 0 2") < text.index('until (exec 3<>"/dev/tcp/') < text.index("start worker0 worker 0 2")
    assert '[ "$node" = worker0 ] && chief_ended=$SECONDS' in text
    assert text.rstrip().endswith("exit $result") and "stop_all ps0\n" in text
    # the command: classic flags through the placeholders, host lists from the allocation, the lab's folders
    assert ("CMD_worker1='python __TFLAB_CODE__/mnist_async.py --job_name=worker --task_index=1 "
            "--ps_hosts=__TFLAB_PS_HOSTS__ --worker_hosts=__TFLAB_WORKER_HOSTS__ --log_dir=__TFLAB_RUN_DIR__ "
            "--data __TFLAB_DATA__/x --keep /database'") in text
    assert 'mapfile -t HOSTS < <(scontrol show hostnames "$SLURM_JOB_NODELIST")' in text
    assert "PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))" in text
    assert "RUN_DIR=$RUNS/train-$SLURM_JOB_ID" in text and "CODE=$LAB/code" in text


@pytest.mark.parametrize("container", slurm.CONTAINERS)
def test_every_form_parses_as_bash(tmp_path: Path, container: str) -> None:
    lab, config = lab_and_config(nodes=3, chief=True, evaluator=True)
    text = slurm.render(config, lab, CLASSIC, container=container, image="registry/lab:1")
    path = tmp_path / "job.sh"
    path.write_text(text)
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if container == "apptainer":
        assert 'apptainer exec --bind "$CODE:/workspace,$DATA:/data:ro,$RUN_DIR:/runs/train"' in text
        assert "__TFLAB_CODE__" not in text and "CMD_chief='python /workspace/mnist_async.py" in text
    elif container == "pyxis":
        assert '--container-image="$IMAGE"' in text and "IMAGE=${TFLAB_IMAGE:-registry/lab:1}" in text
    # the evaluator runs beside the workers and is stopped with the servers
    assert "start evaluator evaluator 0 0" in text and "FINISHERS=(worker0 worker1 chief)" in text


def test_the_tf_config_the_script_builds_is_the_labs(tmp_path: Path) -> None:
    """The script's own tf_config function, run by bash with an allocation's hosts."""
    lab, config = lab_and_config(nodes=3)
    text = slurm.render(config, lab, CLASSIC)
    start = text.index("PS_HOSTS=")
    end = text.index("# -- each lab node's step")
    probe = ("declare -A HOST=([ps0]=c1 [worker0]=c2 [worker1]=c10); PORT=20042\n" + text[start:end]
             + 'tf_config worker 1; echo; echo "$WORKER_HOSTS"\n')
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import json

    config_line, hosts = done.stdout.splitlines()
    assert json.loads(config_line) == {"cluster": {"ps": ["c1:20042"], "worker": ["c2:20042", "c10:20042"]},
                                       "task": {"type": "worker", "index": 1}}
    assert hosts == "c2:20042,c10:20042"


@pytest.mark.parametrize(("options", "said"), [
    ({"container": "docker"}, "--container 'docker'"), ({"time_limit": "1:2"}, "--time '1:2'"),
    ({"time_limit": "soon"}, "--time 'soon'"), ({"partition": "a b"}, "--partition 'a b'"),
    ({"account": "x;rm"}, "--account 'x;rm'"), ({"runs": "it's"}, "--runs"),
    ({"container": "pyxis"}, "--container pyxis needs --image"),
])
def test_bad_options_are_one_sentence(options: dict, said: str) -> None:
    lab, config = lab_and_config(nodes=2)
    with pytest.raises(UserError, match=said.replace("(", r"\(")):
        slurm.render(config, lab, CLASSIC, **options)


def test_render_slurm_writes_a_script_from_the_command_line(runner, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    lab = tmp_path / "lab"
    assert runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "3"]).exit_code == 0
    result = runner.invoke(cli, ["render", "slurm", "--lab", str(lab), "--task", "allreduce", "-o", str(lab / "job.sh")])
    assert result.exit_code == 0, result.stderr
    assert "a Slurm job of 3 nodes; `sbatch job.sh` from the lab folder" in result.stderr.replace("\n", " ")
    text = (lab / "job.sh").read_text()
    assert "CMD_worker0='python __TFLAB_CODE__/allreduce.py'" in text and (lab / "job.sh").stat().st_mode & 0o100
    bad = runner.invoke(cli, ["render", "slurm", "--lab", str(lab), "--time", "tomorrow"])
    assert bad.exit_code != 0 and bad.stderr.startswith("tflab: error: --time 'tomorrow'")


def test_doctor_says_whether_sbatch_is_reachable_and_which_runtime(tmp_path: Path, monkeypatch) -> None:
    from tflab.engine import doctor

    monkeypatch.setenv("PATH", str(tmp_path))
    assert "no sbatch here" in doctor._slurm().detail
    for tool, text in (("sbatch", "slurm 22.05.8"), ("enroot", "")):
        (tmp_path / tool).write_text(f"#!/bin/sh\necho '{text}'\n")
        (tmp_path / tool).chmod(0o755)
    check = doctor._slurm()
    assert check.status == "ok" and check.detail == "slurm 22.05.8 reachable; container runtime: enroot (--container pyxis)"


@pytest.mark.parametrize("proxied", [False, True], ids=["no-proxy", "behind-a-proxy"])
def test_where_the_nodes_carry_proxies_no_proxy_names_the_jobs_hosts(proxied: bool) -> None:
    """Many clusters set proxy variables on their machines; gRPC honours http_proxy: the script's own lines, run by bash
    with an allocation's hosts, add them to NO_PROXY and no_proxy after what was there, and leave a job without
    proxies as it was."""
    lab, config = lab_and_config(nodes=3)
    text = slurm.render(config, lab, CLASSIC)
    start = text.index("# Where the nodes carry proxy variables")
    end = text.index('PS_HOSTS="')
    proxies = "export http_proxy=http://proxy.corp:3128 no_proxy=.corp\n" if proxied else "unset NO_PROXY no_proxy\n"
    probe = ("unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY grpc_proxy all_proxy ALL_PROXY\n" + proxies
             + "HOSTS=(c1 c2 c10)\n" + text[start:end] + 'echo "${NO_PROXY-unset}|${no_proxy-unset}"\n')
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    expected = ".corp,c1,c2,c10,localhost,127.0.0.1,::1" if proxied else "unset"
    assert done.stdout == f"{expected}|{expected}\n"


def test_keras_2_reaches_every_step() -> None:
    lab, config = lab_and_config(nodes=2)
    assert "TF_USE_LEGACY_KERAS" not in slurm.render(config, lab, CLASSIC)
    text = slurm.render(cfg.LabConfig(**{**config.__dict__, "keras": 2}), lab, CLASSIC)
    assert "export TFLAB_TASK=train PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 TF_USE_LEGACY_KERAS=1\n" in text
