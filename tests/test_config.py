"""tflab.yaml and task placeholders."""

from __future__ import annotations

import pytest

from tflab import config as cfg
from tflab.errors import UserError
from tflab.gpus import Gpu
from tflab.model import Topology


def test_round_trip_keeps_everything() -> None:
    config = cfg.LabConfig(
        name="lab", topology=Topology(nodes=4, gpus_per_node=2, chief=True, ssh_port_base=30000),
        gpus=(Gpu(0, name="H100", memory_mib=81559), Gpu(1)), base_image=cfg.LOCAL_BASE,
        code="../code", data="../data", data_mode="mount",
        tasks={"train": cfg.Task("train", "python t.py"), "pss": cfg.Task("pss", "python p.py", ("ps", "worker"))},
    )
    again = cfg.from_yaml(cfg.to_yaml(config))
    assert again.topology == Topology(nodes=4, ps=1, gpus_per_node=2, chief=True, ssh_port_base=30000)
    assert again.gpus == config.gpus
    assert again.tasks == config.tasks
    assert (again.code, again.data, again.data_mode, again.base_image) == ("../code", "../data", "mount", cfg.LOCAL_BASE)


def test_placeholders_are_filled_and_other_braces_left_alone() -> None:
    command = "python t.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} -c '{x: 1}'"
    values = {"node": "worker1", "job_name": "worker", "task_index": "1", "ps_hosts": "ps0:2222",
              "worker_hosts": "w", "num_gpus": "2", "run_dir": "/runs/t"}
    assert cfg.fill_placeholders(command, values) == (
        "python t.py --job_name=worker --task_index=1 --ps_hosts=ps0:2222 -c '{x: 1}'"
    )


@pytest.mark.parametrize(("text", "message"), [
    ("topology: [1, 2]", "`topology` must be a mapping"),
    ("topology: {nodes: four}", "not a number"),
    ("tasks: {train: 3}", "task 'train' needs a command"),
    ("tasks: {t: {command: x, servers: [boss]}}", "`servers` lists roles"),
    ("data_mode: rsync", "data_mode must be copy or mount"),
    ("a: [", "is not valid YAML"),
])
def test_malformed_lab_files_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        cfg.from_yaml(text)


def test_unknown_task_names_the_known_ones() -> None:
    config = cfg.LabConfig(name="l", topology=Topology(nodes=1), tasks={"train": cfg.Task("train", "x")})
    with pytest.raises(UserError, match="no task 'trian' in tflab.yaml; its tasks are: train"):
        config.task("trian")
