"""A task of tflab.yaml made concrete for one node: its argv and environment."""

from __future__ import annotations

from tflab import config as cfg
from tflab.labfiles import LabFiles


def run_dir(task: str) -> str:
    """Where a task's outputs go inside every node (on the shared runs folder)."""
    return f"/runs/{task}"


def task_env(task: str) -> dict[str, str]:
    """What a task sees besides the node's own environment."""
    return {"TFLAB_TASK": task, "TFLAB_RUN_DIR": run_dir(task)}


def placeholder_values(lf: LabFiles, node_name: str, task: str) -> dict[str, str]:
    """A node's values for the task placeholders."""
    env = lf.lab.node(node_name).env
    return {
        "node": env["TFLAB_NODE"],
        "job_name": env["TFLAB_JOB_NAME"],
        "task_index": env["TFLAB_TASK_INDEX"],
        "ps_hosts": env["TFLAB_PS_HOSTS"],
        "worker_hosts": env["TFLAB_WORKER_HOSTS"],
        "num_gpus": env["TFLAB_NUM_GPUS"],
        "run_dir": run_dir(task),
    }


def task_argv(lf: LabFiles, node_name: str, task_name: str) -> list[str]:
    """The argv that runs task `task_name` as `node_name`."""
    task = lf.config.task(task_name)
    return ["sh", "-c", cfg.fill_placeholders(task.command, placeholder_values(lf, node_name, task_name))]
