"""One `tflab run TASK`, put together: its folder, its record, the launcher, and the cluster watched beside it.

The command line hands in where the output goes (a sink that prints) and the signals; the
rest is here: a fresh (or resumed) run folder, run.json kept up to date, the cluster's figures
written for TensorBoard while the launcher runs the task, and the verdict with the host's
note when the host set the pace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from tflab.engine.executors import Executor
from tflab.host.labfiles import LabFiles
from tflab.plan import knobs as knob_rules
from tflab.plan import links, tasks
from tflab.plan.config import Task
from tflab.plan.knobs import Knobs
from tflab.run import failures, history, pictures
from tflab.run.cluster import ClusterWatch
from tflab.run.launcher import Injector, Launcher, RunResult, RunSetup, Sink
from tflab.run.runplan import RunPlan
from tflab.run.runreport import RunReport


@dataclass(frozen=True)
class RunOptions:
    """What `tflab run` was asked for beyond the task."""

    resume: bool = False
    detached: bool = False
    metrics: bool = True  # the cluster's figures, written for TensorBoard
    knobs: Knobs = Knobs()  # what this run changes of the lab's design


class TaskRun:
    """A run of one task on a lab, from its folder to its verdict."""

    def __init__(self, lf: LabFiles, executor: Executor, definition: Task, plan: RunPlan, options: RunOptions,
                 make_sink: Callable[[IO[str]], Sink], injector: Injector | None = None) -> None:
        self.lf = lf
        self.options = options
        self.folder = history.fresh_run_dir(lf.runs_dir, definition.name, options.resume)
        self.record = history.RunRecorder(self.folder, definition.name, options.detached, time.time())
        self.record.knobs = options.knobs.as_dict() if options.knobs else None
        self.output_log = (self.folder / history.OUTPUT_FILE).open("a")
        self.sink = make_sink(self.output_log)
        knobs = options.knobs
        lab = knob_rules.run_lab(lf.lab, knobs)
        commands = {name: knob_rules.fill_env(line, knobs.env)
                    for name, line in tasks.commands(lab, definition).items()}
        self.launcher = Launcher(
            executor, plan,
            RunSetup(definition.name, commands, tasks.task_env(definition.name),
                     self.folder / history.LOG_DIR, progress=definition.progress, runs_dir=lf.runs_dir, node_env=knob_rules.env_changes(lf.lab, lab, knobs)),
            self.sink, on_state=lambda state, machine: self.record.write(state, machine), injector=injector,
        )
        host_cpus = len(lf.config.host.cpus) or 1
        rate = lf.config.links.rate if knobs.link_rate is None else knobs.link_rate
        shaped = rate is not None and rate != knob_rules.UNSHAPED
        self.watch = (ClusterWatch(executor, lab, self.folder, self.launcher.machine, host_cpus,
                                   link_mbit=links.rate_bits(rate) / 1e6 if rate is not None and shaped else None,
                                   on_cpu=self.launcher.heard_cpu)
                      if options.metrics else None)

    def diagnoses(self, result: RunResult) -> dict[str, dict[str, str]]:
        """The known failure each failed or stalled node's output shows; a stalled one's output naming none, what
        the look at the stalled cluster found."""
        verdicts = {name: node.verdict for name, node in result.machine.nodes.items()}
        found = {node: failure.as_dict()
                 for node, failure in failures.diagnose_nodes(verdicts, self.folder / history.LOG_DIR).items()}
        if result.stall is not None:
            for node in result.stall.record["stalled"]:
                found.setdefault(node, result.stall.diagnosis)
        return found

    def interrupt(self, reason: str = "interrupted", force: bool = False) -> None:
        """Stop the run (safe in a signal handler)."""
        self.launcher.interrupt(reason, force)

    def execute(self, on_start: Callable[[], None] | None = None,
                on_end: Callable[[], None] | None = None) -> tuple[RunResult, RunReport]:
        """Run to the verdict; (the result, run.json as written at the end).

        `on_start` is called before anything starts (a run's knobs set), `on_end` after everything
        stopped however it ended (the knobs restored); both may still tell the run's output.
        """
        try:
            if on_start is not None:
                on_start()
            if self.watch is not None:
                self.watch.start()
            try:
                result = self.launcher.execute()
            finally:
                limit = self.watch.stop() if self.watch is not None else None
            report = self.record.write("finished", result.machine, result.result_line, result.first_step_s,
                                     limit=limit.as_dict() if limit is not None else None,
                                     cluster=self.watch.series.means() if self.watch is not None else None,
                                     diagnoses=self.diagnoses(result),
                                     stall=result.stall.record if result.stall is not None else None)
            try:
                pictures.write(self.folder, self.record.task, result.machine, report)
            except Exception as exc:  # noqa: BLE001 - a picture that cannot be drawn never fails the run
                logging.getLogger("tflab.run").warning("the run's pictures were not written: %s", exc)
            return result, report
        finally:
            try:
                if on_end is not None:
                    on_end()
            finally:
                self.output_log.close()
