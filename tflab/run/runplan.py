"""What one run asks of its state machine: who serves, who must finish, who is chief, how patient to be.

Built from a lab and a task (`run_plan` for `tflab run`, `exec_plan` for one node's `tflab exec`);
the machine (run/machine.py) judges the run's events by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tflab.plan.config import Task
from tflab.plan.faults import Fault
from tflab.plan.shares import memory_text
from tflab.plan.tasks import start_order
from tflab.plan.topology import Lab

SERVER, SIDECAR, FINISHER = "server", "sidecar", "finisher"  # the roles a run gives its nodes

@dataclass(frozen=True)
class RunPlan:
    """Who does what in a run, and how patient to be."""

    servers: tuple[str, ...]
    finishers: tuple[str, ...]
    chief: str
    sidecars: tuple[str, ...] = ()
    grace_s: float = 30.0  # silence allowed after the chief finished
    timeout_s: float | None = None
    ready_timeout_s: float = 120.0  # the wait for a server; past it, only while it is busy starting
    restarts: int = 0  # per non-chief finisher
    recovery_wait_s: float = 30.0  # TF1 MonitoredTrainingSession's recovery_wait_secs
    task_index: dict[str, int] = field(default_factory=dict)  # for the device_filters hint
    stop_hung: bool = True  # False: a hung finisher is reported, and left to the user (`tflab exec` without --grace)
    memory_limits: dict[str, str] = field(default_factory=dict)  # node -> its memory limit, as people read it
    faults: tuple[Fault, ...] = ()  # the drill (`--fault`)
    expect: str | None = None  # survive | fail: what the drill should do to the training
    drill_stall_s: float = 60.0  # a drilled run that makes no progress this long is ended, the drill named
    # A run whose finishers printed no step, and in which no node printed or computed, for this long is stalled: it
    # ends, saying who never joined (0: never)
    stall_s: float = 120.0
    # Restarts of an all-reduce job restart every worker (they train in lockstep; one cannot rejoin alone).
    gang_restart: bool = False


def run_plan(lab: Lab, task: Task, grace_s: float = 30.0, timeout_s: float | None = None,
             restarts: int = 0, ready_timeout_s: float = 120.0, faults: tuple[Fault, ...] = (),
             expect: str | None = None, stall_s: float = 120.0) -> RunPlan:
    """The run state machine's plan for `task` on `lab`."""
    servers, sidecars, finishers = start_order(lab, task)
    return RunPlan(
        servers=tuple(n.name for n in servers),
        sidecars=tuple(n.name for n in sidecars),
        finishers=tuple(n.name for n in finishers),
        chief=lab.chief.name,
        grace_s=grace_s,
        timeout_s=timeout_s,
        ready_timeout_s=ready_timeout_s,
        restarts=restarts,
        task_index={n.name: n.task_index for n in lab.nodes if n.job == "worker"},
        memory_limits={n.name: memory_text(n.share.memory_mib) for n in lab.nodes if n.share.memory_mib},
        faults=faults,
        expect=expect,
        stall_s=stall_s,
        gang_restart=not servers,
    )


def exec_plan(lab: Lab, task: Task, node: str, grace_s: float | None = None, stall_s: float = 120.0) -> RunPlan:
    """The rules one `tflab exec` of a worker is judged by: the run's, for that worker alone.

    Its chief runs in another exec (or is this node); with `grace_s`, a worker still waiting
    that long after the chief's exec finished is stopped, else it is only reported.
    """
    whole = run_plan(lab, task, grace_s=30.0 if grace_s is None else grace_s)
    return RunPlan(servers=(), finishers=(node,), chief=whole.chief, grace_s=whole.grace_s,
                   task_index=whole.task_index, stop_hung=grace_s is not None, memory_limits=whole.memory_limits,
                   stall_s=stall_s)
