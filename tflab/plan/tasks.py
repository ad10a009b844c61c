"""A task of tflab.yaml made concrete for the lab: each node's command line, environment, roles."""

from __future__ import annotations

from tflab.plan import config as cfg
from tflab.plan.config import Task
from tflab.plan.topology import Lab, Node


def run_dir(task: str) -> str:
    """Where a task's outputs go inside every node (on the shared runs folder)."""
    return f"/runs/{task}"


def task_env(task: str) -> dict[str, str]:
    """What a task sees besides the node's own environment."""
    return {"TFLAB_TASK": task, "TFLAB_RUN_DIR": run_dir(task)}


def placeholder_values(lab: Lab, node_name: str, task: str) -> dict[str, str]:
    """A node's values for the task placeholders."""
    env = lab.node(node_name).env
    return {
        "node": env["TFLAB_NODE"],
        "job_name": env["TFLAB_JOB_NAME"],
        "task_index": env["TFLAB_TASK_INDEX"],
        "ps_hosts": env["TFLAB_PS_HOSTS"],
        "worker_hosts": env["TFLAB_WORKER_HOSTS"],
        "num_gpus": env["TFLAB_NUM_GPUS"],
        "run_dir": run_dir(task),
    }


def command_line(lab: Lab, node_name: str, task: Task) -> str:
    """The command line that runs `task` as `node_name` (placeholders filled)."""
    return cfg.fill_placeholders(task.command, placeholder_values(lab, node_name, task.name))


def commands(lab: Lab, task: Task) -> dict[str, str]:
    """Every node's command line for `task`."""
    return {name: command_line(lab, name, task) for name in lab.names}


def start_order(lab: Lab, task: Task) -> tuple[list[Node], list[Node], list[Node]]:
    """(servers, sidecars, finishers): servers start first and only serve; the run ends with the finishers.

    The evaluator is a sidecar unless the task lists it among its servers: it runs beside
    the finishers and is stopped with the servers.
    """
    servers = [n for n in lab.nodes if n.job in task.servers]
    sidecars = [n for n in lab.nodes if n.job == "evaluator" and n.job not in task.servers]
    finishers = [n for n in lab.nodes if n.job not in task.servers and n.job != "evaluator"]
    return servers, sidecars, finishers


def servers_for_exec(lab: Lab, task: Task, node_name: str) -> list[Node]:
    """The servers `tflab exec NODE TASK` needs: none when NODE is itself one of them."""
    node = lab.node(node_name)
    if node.job in task.servers:
        return []
    return [n for n in lab.nodes if n.job in task.servers and n.name != node_name]


