"""`tflab run`'s process I/O: carries out what the run state machine decides.

Threads only read output and wait; every decision is `runstate.RunMachine`'s. Each
reader reports its process's end from a `finally` (executor.py), and the loop below
processes every queued event, in order, before it acts on a verdict, so no exit is ever
missed. Signals reach the run as `interrupt()`, which is safe to call from a handler.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from tflab import guard, steps
from tflab.errors import TflabError
from tflab.executor import Attached, Executor
from tflab.threads import parallel
from tflab.runstate import (
    Began, Event, Exited, Finish, Interrupted, Output, Release, RunMachine, RunPlan, Say, Serving, Start, Stop,
    Tick,
)

log = logging.getLogger("tflab.launcher")
TICK_S = 0.2


class Sink(Protocol):
    """Where a run's output goes (the terminal, a file): lines of nodes and tflab's own messages."""

    def line(self, node: str, text: str) -> None: ...

    def event(self, message: str) -> None: ...


@dataclass(frozen=True)
class RunSetup:
    """What a run starts: a command line per node, the environment, where logs go."""

    task: str
    commands: Mapping[str, str]
    env: Mapping[str, str]
    log_dir: Path
    preload: bool = True
    warm: bool = True
    stop_grace_s: float = guard.STOP_GRACE_S
    report_every_s: float = 10.0


@dataclass
class RunResult:
    """How the run ended, and each node's part in it."""

    finish: Finish
    machine: RunMachine
    first_step_s: float | None = None
    result_line: str | None = None
    last_lines: dict[str, str] = field(default_factory=dict)


def warm_up(executor: Executor, names: list[str]) -> None:
    """Make each node's standby interpreter (a no-op where one is there already); never fails a command."""

    def spawn(name: str) -> None:
        try:
            executor.spawn(name, guard.standby())
        except TflabError as exc:
            log.debug("no standby in %s: %s", name, exc)

    parallel(spawn, names, name="standby")


class Launcher:
    """Runs one task across the lab through an executor, to the machine's verdict."""

    def __init__(self, executor: Executor, plan: RunPlan, setup: RunSetup, sink: Sink,
                 on_state: Callable[[str, RunMachine], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.plan = plan
        self.setup = setup
        self.sink = sink
        self.on_state = on_state or (lambda _state, _machine: None)
        self.clock = clock
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.machine = RunMachine(plan)
        self.processes: dict[str, Attached] = {}
        self.logs: dict[str, IO[bytes]] = {}
        self.last_lines: dict[str, str] = {}
        self._print_lock = threading.Lock()
        self._first_step: float | None = None
        self._sink_failed = False
        self._began = 0.0

    # -- called from other threads and signal handlers -------------------------------------------

    def interrupt(self, reason: str = "interrupted", force: bool = False) -> None:
        """Stop the run (SimpleQueue.put is safe in a signal handler); `force` kills at once."""
        self.events.put(Interrupted(self.clock(), reason, force))

    # -- the run ---------------------------------------------------------------------------

    def execute(self) -> RunResult:
        """Run to the verdict; when it returns, nothing this run started runs in any node."""
        nodes = list(self.machine.nodes)
        self.setup.log_dir.mkdir(parents=True, exist_ok=True)
        self._sweep(nodes, force=True)  # whatever an earlier run of this task left behind
        self._began = self.clock()
        self._apply(self.machine.handle(Began(self._began)))
        self.on_state("starting", self.machine)
        last_tick = last_report = self.clock()
        drain_deadline: float | None = None
        announced_running = False
        while True:
            try:
                event: Event | None = self.events.get(timeout=TICK_S)
            except queue.Empty:
                event = None
            now = self.clock()
            if event is not None:
                self._apply(self.machine.handle(event))
            if now - last_tick >= TICK_S or event is None:
                last_tick = now
                self._apply(self.machine.handle(Tick(now)))
            if not announced_running and self.machine.released:
                announced_running = True
                self.on_state("running", self.machine)
            if now - last_report >= self.setup.report_every_s and not self.machine.finished:
                last_report = now
                self._report_rates()
            if self.machine.finished:
                drain_deadline = drain_deadline or now + self.setup.stop_grace_s + 15
                if not self.machine.running() or now > drain_deadline:
                    break
        for name in self.machine.running():  # never ended, even when told to: say so
            self.machine.handle(Exited(name, None, self.clock(), "did not stop; killed"))
        self._sweep(nodes, force=True)
        if self.setup.warm:
            warm_up(self.executor, nodes)  # ready for the next run (imports in the background)
        for handle in self.logs.values():
            handle.close()
        assert self.machine.finish is not None
        chief_last = self.last_lines.get(self.plan.chief)
        return RunResult(self.machine.finish, self.machine,
                         None if self._first_step is None else self._first_step - self._began,
                         chief_last, dict(self.last_lines))

    # -- actions ---------------------------------------------------------------------------

    def _apply(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Start):
                for name in action.nodes:
                    self._start(name, action.held, action.attempt)
            elif isinstance(action, Release):
                for name in action.nodes:
                    if name in self.processes:
                        self.processes[name].release()
            elif isinstance(action, Stop):
                for name in action.nodes:
                    threading.Thread(target=self._stop, args=(name, action.force), daemon=True,
                                     name=f"stop-{name}").start()
            elif isinstance(action, Say):
                self._say(action.message)
            elif isinstance(action, Finish):
                self.on_state("stopping", self.machine)

    def _start(self, name: str, held: bool, attempt: int) -> None:
        key = guard.run_key(self.setup.task, name)
        argv = guard.run(key, self.setup.commands[name], held=held, preload=held and self.setup.preload,
                         warm=self.setup.warm and self.setup.preload, grace_s=self.setup.stop_grace_s)
        handle = self.logs.get(name)
        if handle is None:
            handle = self.logs[name] = (self.setup.log_dir / f"{name}.log").open("ab")
        if attempt > 1:
            handle.write(f"--- tflab: attempt {attempt} ---\n".encode())
        splitter = steps.LineSplitter()

        def on_output(chunk: bytes, _is_err: bool) -> None:
            handle.write(chunk)
            handle.flush()
            for text in splitter.feed(chunk):
                self._line(name, text)

        def on_exit(code: int | None, reason: str | None) -> None:
            try:
                for text in splitter.rest():
                    self._line(name, text)
            finally:
                self.events.put(Exited(name, code, self.clock(), reason))

        try:
            self.processes[name] = self.executor.start(name, argv, on_output, on_exit, env=self.setup.env)
        except TflabError as exc:
            self.events.put(Exited(name, None, self.clock(), str(exc)))
            return
        if name in self.plan.servers:
            threading.Thread(target=self._probe, args=(name, key), daemon=True, name=f"probe-{name}").start()

    def _line(self, name: str, text: str) -> None:
        step = steps.step_of(text)
        now = self.clock()
        if step is not None and self._first_step is None and name in self.plan.finishers:
            self._first_step = now
        if text.strip() and not steps.is_noise(text):
            self.last_lines[name] = text
        self.events.put(Output(name, now, step))
        self._show(self.sink.line, name, text)

    def _probe(self, name: str, key: str) -> None:
        try:
            code, _ = self.executor.run(name, guard.probe(name, key, self.plan.ready_timeout_s))
        except TflabError as exc:
            log.debug("probe of %s failed: %s", name, exc)
            return
        if code == 0:
            self.events.put(Serving(name, self.clock()))

    def _stop(self, name: str, force: bool) -> None:
        process = self.processes.get(name)
        key = guard.run_key(self.setup.task, name)
        if process is not None and not force:
            process.close()  # the guard stops the group: TERM, then KILL after the grace
            if process.wait(self.setup.stop_grace_s + 3):
                return
        try:
            self.executor.run(name, guard.stop([key], force=True))
        except TflabError:
            pass  # the node itself is gone: nothing of the task is left in it
        if process is not None:
            process.close()
            process.wait(5)

    def _sweep(self, nodes: list[str], force: bool) -> None:
        """Stop every process of this task's runs in every node (in parallel)."""
        pattern = guard.run_key(self.setup.task, "*")

        def sweep(name: str) -> None:
            try:
                self.executor.run(name, guard.stop([pattern], force=force))
            except TflabError:
                pass

        threads = [threading.Thread(target=sweep, args=(n,), daemon=True) for n in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)

    def _say(self, message: str) -> None:
        self._show(self.sink.event, message)

    def _show(self, show: Callable[..., None], *args: str) -> None:
        """Hand a line to the sink; a sink that fails (a closed stdout) stops the run, once."""
        with self._print_lock:
            if self._sink_failed:
                return
            try:
                show(*args)
            except Exception as exc:  # noqa: BLE001 - whatever broke the output, the run must not hang
                self._sink_failed = True
                self.interrupt(f"the output failed ({type(exc).__name__}: {exc})")

    def _report_rates(self) -> None:
        rates = []
        for name in self.plan.finishers:
            node = self.machine.nodes[name]
            rate = steps.rate(node.steps, self.setup.report_every_s * 1.5)
            if node.running and rate is not None:
                rates.append(f"{name} {rate:.1f}")
        if rates:
            self._say("steps/s: " + ", ".join(rates))
