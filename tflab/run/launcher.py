"""`tflab run`'s processes: started in the nodes, their output read into events, the machine's decisions carried out.

Threads only read output and wait; every decision is the run's state machine's (run/machine.py).
Each reader reports its process's end from a `finally` (engine/executors.py), and the one
supervision loop (run/drive.py) hands every queued event to the machine, in order, before it
acts on a verdict, so no exit is ever missed. Signals reach the run as `interrupt()`, which is
safe to call from a handler.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Protocol

from tflab_guard import protocol

from tflab.engine import guardcmd, guardwait
from tflab.engine.attached import End
from tflab.engine.executors import Attached, Executor
from tflab.errors import TflabError
from tflab.host.fanout import background, parallel
from tflab.host.leases import LEASES
from tflab.plan.faults import Fault
from tflab.run import stalls
from tflab.run.events import (
    Began,
    Busy,
    Check,
    Event,
    Exited,
    Finish,
    Heal,
    Healed,
    Inject,
    Injected,
    Inspect,
    Interrupt,
    NotServing,
    Release,
    Revive,
    Revived,
    Say,
    Serving,
    Stacks,
    Start,
    Stop,
)
from tflab.run.watch import ProcessWatch
from tflab.run.drive import RECORD_EVERY_S, Every, drive
from tflab.run.machine import RunMachine
from tflab.run.runplan import RunPlan
from tflab.run.stalls import Findings, Look

log = logging.getLogger("tflab.launcher")


class Injector(Protocol):
    """What does a drill's faults to the nodes, and heals them (engine.faults.FaultInjector)."""

    def apply(self, fault: Fault) -> str: ...

    def heal(self, fault: Fault) -> str: ...

    def revive(self, node: str) -> None: ...

    def clear(self) -> list[str]: ...


class Sink(Protocol):
    """Where a run's output goes (the terminal, a file): lines of nodes and tflab's own messages."""

    def line(self, node: str, text: str) -> None: ...

    def update(self, node: str, text: str) -> None:
        """A node's line not ended yet, redrawn (a progress bar): shown in place where the sink can."""

    def event(self, message: str) -> None: ...


@dataclass(frozen=True)
class RunSetup:
    """What a run starts: a command line per node, the environment, where logs go."""

    task: str
    commands: Mapping[str, str]
    env: Mapping[str, str]
    log_dir: Path
    stop_grace_s: float = protocol.STOP_GRACE_S
    runs_dir: Path | None = None  # the lab's runs folder (every node's /runs): its leases are renewed there too
    report_every_s: float = 10.0
    progress: str | None = None  # the task's own progress pattern (tflab.yaml `progress:`)
    node_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # per node, what the run's knobs set

    def env_for(self, node: str) -> dict[str, str]:
        """The environment `node`'s process gets besides the node's own."""
        return {**self.env, **self.node_env.get(node, {})}


@dataclass
class RunResult:
    """How the run ended, and each node's part in it."""

    finish: Finish
    machine: RunMachine
    first_step_s: float | None = None
    result_line: str | None = None
    last_lines: dict[str, str] = field(default_factory=dict)
    stall: Findings | None = None  # a stalled run's look at its cluster (run/stalls)



class Launcher:
    """Runs one task across the lab through an executor, to the machine's verdict."""

    def __init__(self, executor: Executor, plan: RunPlan, setup: RunSetup, sink: Sink,
                 on_state: Callable[[str, RunMachine], object] | None = None,
                 clock: Callable[[], float] = time.monotonic, injector: Injector | None = None) -> None:
        self.executor = executor
        self.plan = plan
        self.setup = setup
        self.sink = sink
        self.on_state = on_state or (lambda _state, _machine: None)
        self.clock = clock
        self.injector = injector
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.machine = RunMachine(plan)
        self.processes: dict[str, Attached] = {}
        self.logs: dict[str, IO[bytes]] = {}
        self.watches: dict[str, ProcessWatch] = {}
        self._print_lock = threading.Lock()
        self._first_step: float | None = None
        self._sink_failed = False
        self._began = 0.0
        self.stall: Findings | None = None
        self.leases: dict[str, Path] = {}  # key -> its lease's file on the host, renewed while the run goes on

    # -- called from other threads and signal handlers -------------------------------------------

    def interrupt(self, reason: str = "interrupted", force: bool = False) -> None:
        """Stop the run (SimpleQueue.put is safe in a signal handler); `force` kills at once."""
        self.events.put(Interrupt(self.clock(), reason, force))

    def heard_cpu(self, cpu: Mapping[str, float | None]) -> None:
        """The nodes' CPU use over the last second or two (the cluster's figures): what tells a stall from work."""
        self.events.put(Busy(self.clock(), tuple(cpu.items())))

    # -- the run ---------------------------------------------------------------------------

    def execute(self) -> RunResult:
        """Run to the verdict; when it returns, nothing this run started runs in any node."""
        self.setup.log_dir.mkdir(parents=True, exist_ok=True)
        self._began = self.clock()
        self._apply(self.machine.handle(Began(self._began)))
        self.on_state("starting", self.machine)
        recorded: list[float | None] = [None]
        drain_deadline: list[float | None] = [None]

        def keep_record(now: float) -> None:
            """run.json says "running" once the workers are released, then is kept current (`tflab top`, `runs`)."""
            if self.machine.released and not self.machine.finished and (
                    recorded[0] is None or now - recorded[0] >= RECORD_EVERY_S):
                recorded[0] = now
                self.on_state("running", self.machine)

        def report(now: float) -> None:
            if not self.machine.finished:
                self._report_rates()

        def give_up(now: float) -> str | None:
            if not self.machine.finished:
                return None
            deadline = drain_deadline[0] = drain_deadline[0] or now + self.setup.stop_grace_s + 15
            return "did not stop; killed" if now > deadline else None  # never ended, even when told to

        drive(self.machine, self.events, self._apply, self.clock,
              every=(Every(0.0, keep_record), Every(self.setup.report_every_s, report)), give_up=give_up)
        self._heal_drills()
        # What ended with its guard's word is gone; the rest (its ending unknown, or never started) is stopped now.
        # (An earlier run's process of the same node is stopped by the guard of this one as it starts.)
        self._clear([name for name, node in self.machine.nodes.items() if node.ended is None or node.ended_by is None])
        for handle in self.logs.values():
            handle.close()
        for path in self.leases.values():
            LEASES.release(path)
        assert self.machine.finish is not None
        last_lines = {name: watch.last_line for name, watch in self.watches.items() if watch.last_line}
        chief_last = last_lines.get(self.plan.chief)
        return RunResult(self.machine.finish, self.machine,
                         None if self._first_step is None else self._first_step - self._began,
                         chief_last, last_lines, self.stall)

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
                    background(self._stop, name, action.force, name=f"stop-{name}")
            elif isinstance(action, Say):
                self._say(action.message)
            elif isinstance(action, Check):
                self._check(action)
            elif isinstance(action, Inspect):
                for name in action.nodes:
                    background(self._inspect, name, name=f"inspect-{name}")
            elif isinstance(action, Finish):
                self.on_state("stopping", self.machine)
            elif isinstance(action, (Inject, Heal, Revive)):
                background(self._drill, action, name="drill")

    def _start(self, name: str, held: bool, attempt: int) -> None:
        key = protocol.run_key(self.setup.task, name)
        start_id = f"{attempt}-{uuid.uuid4().hex[:8]}"  # the probe of a server counts this start's ending only
        argv = guardcmd.run_line(key, self.setup.commands[name], held=held, grace_s=self.setup.stop_grace_s,
                                 start_id=start_id)
        handle = self.logs.get(name)
        if handle is None:
            handle = self.logs[name] = (self.setup.log_dir / f"{name}.log").open("ab")
        if attempt > 1:
            handle.write(f"--- tflab: attempt {attempt} ---\n".encode())
        earlier = self.watches.get(name)
        watch = self.watches[name] = ProcessWatch(name, key, self.executor, self.events, self.clock,
                                                  self.setup.progress, show=partial(self._show, self.sink.line, name),
                                                  update=partial(self._show, self.sink.update, name),
                                                  on_step=partial(self._stepped, name))
        if earlier is not None:
            watch.last_line = earlier.last_line  # an attempt's result, until the next one prints its own

        def on_output(chunk: bytes, is_err: bool) -> None:
            handle.write(chunk)
            handle.flush()
            watch.output(chunk, is_err)

        if self.setup.runs_dir is not None and key not in self.leases:
            self.leases[key] = LEASES.hold(self.setup.runs_dir, key)  # before its guard looks at it
        try:
            self.processes[name] = self.executor.start(name, argv, on_output, watch.exited, env=self.setup.env_for(name),
                                                       renew=True, resume=guardcmd.reattach(key))
        except TflabError as exc:
            self.events.put(Exited(name, None, self.clock(), str(exc)))
            return
        if name in self.plan.servers:
            background(self._probe, name, key, start_id, name=f"probe-{name}")

    def _stepped(self, name: str, t: float) -> None:
        """A node's progress reading at `t`: the run's first step is a finisher's first."""
        if self._first_step is None and name in self.plan.finishers:
            self._first_step = t

    def _drill(self, action: Inject | Heal | Revive) -> None:
        """Do a drill's step through the injector; the machine hears how it went."""
        if self.injector is None:
            if isinstance(action, Inject):  # the machine holds the node's exit until it hears
                self.events.put(Injected(action.index, self.clock(), error="this run has no fault injector"))
            return
        faults = self.plan.faults
        began = self.clock()
        try:
            if isinstance(action, Inject):
                done = self.injector.apply(faults[action.index])
                self.events.put(Injected(action.index, self.clock(), done, began=began))
            elif isinstance(action, Heal):
                done = self.injector.heal(faults[action.index])
                self.events.put(Healed(action.index, self.clock(), done))
            else:
                self.injector.revive(action.node)
                self.events.put(Revived(action.node, self.clock()))
        except TflabError as exc:
            if isinstance(action, Inject):
                self.events.put(Injected(action.index, self.clock(), error=str(exc), began=began))
            elif isinstance(action, Heal):
                self.events.put(Healed(action.index, self.clock(), f"could not heal: {exc}"))
            else:
                self.events.put(Revived(action.node, self.clock(), error=str(exc)))

    def _heal_drills(self) -> None:
        """After a drill, nothing of it is left: every node up, unfrozen, its links and quota its own."""
        if self.injector is None or not self.plan.faults:
            return
        try:
            healed = self.injector.clear()
        except TflabError as exc:
            self._say(f"drill: could not heal everything: {exc}; `tflab fault clear` tries again")
            return
        if healed:
            self._say("drill: healed " + "; ".join(healed))

    def _check(self, action: Check) -> None:
        """A stalled run, before anything stops: every node asked whether each other's port answers from it, and
        which proxies its programs see; what that says is said, and kept for run.json."""
        self._say(f"the run is stalled: asking {', '.join(action.nodes)} which of the others each reaches")

        def look(name: str) -> Look:
            peers = [peer for peer in action.nodes if peer != name]
            try:
                _code, output = self.executor.run(name, guardcmd.reach(peers))
            except TflabError:
                return Look(name)
            return stalls.read_look(name, output, self.setup.env_for(name))

        looks = {found.node: found for found in parallel(look, list(action.nodes), name="stall-look")}
        self.stall = stalls.findings(action.stalled, looks)
        for sentence in self.stall.said:
            self._say(sentence)

    def _inspect(self, name: str) -> None:
        """Where `name`'s process waits (its stacks), kept in its log whole and told to the machine (Stacks)."""
        dump, problem = guardwait.stack_of(self.executor, name, protocol.run_key(self.setup.task, name))
        handle = self.logs.get(name)
        if handle is not None and dump:
            handle.write(f"--- tflab: where {name} waits (py-spy dump) ---\n{dump.rstrip()}\n".encode())
            handle.flush()
        self.events.put(Stacks(name, self.clock(), dump, problem))

    def _probe(self, name: str, key: str, start_id: str) -> None:
        """Wait for a server to serve (guardwait.await_serving): Serving, or NotServing saying why not; a server
        that ended first says so itself (Exited)."""
        try:
            waited = guardwait.await_serving(self.executor, name, key, self.plan.ready_timeout_s, self._say,
                                            start_id=start_id)
        except TflabError as exc:
            self.events.put(NotServing(name, self.clock(), f"{name} could not be asked whether it serves: {exc}"))
            return
        if waited.outcome == guardwait.ServeOutcome.SERVING:
            self.events.put(Serving(name, self.clock()))
        elif waited.outcome == guardwait.ServeOutcome.LATE:
            self.events.put(NotServing(name, self.clock(), waited.problem or f"{name} did not serve"))

    def _stop(self, name: str, force: bool) -> None:
        process = self.processes.get(name)
        key = protocol.run_key(self.setup.task, name)
        if process is not None and not force:
            process.close()  # the guard stops the group: TERM, then KILL after the grace
            if process.wait(self.setup.stop_grace_s + 3):
                return
        try:
            self.executor.run(name, guardcmd.stop([key], force=True))
        except TflabError:
            pass  # the node itself is gone: nothing of the task is left in it
        if process is not None:
            process.close()
            process.wait(5)

    def _clear(self, nodes: list[str]) -> None:
        """Stop every process of this task's runs in these nodes (in parallel)."""
        pattern = protocol.run_key(self.setup.task, "*")

        def clear(name: str) -> None:
            try:
                self.executor.run(name, guardcmd.stop([pattern], force=True))
            except TflabError:
                pass  # the node itself is gone: nothing of the task is left in it

        parallel(clear, nodes, name="clear")

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
            rate = node.rate(self.setup.report_every_s * 1.5)
            if node.running and rate is not None:
                rates.append(f"{name} {rate:.1f}")
        if rates:
            self._say("steps/s: " + ", ".join(rates))
