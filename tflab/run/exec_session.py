"""`tflab exec NODE TASK`: one node runs a task, with the servers it needs started and shared, watched like a run's worker.

The first exec of a task starts a session: the task's run folder starts fresh (unless
--resume, as `tflab run`), the task's servers (the ps) are started and waited on. Later execs
of the same task, from other terminals, join the session: its servers, its folder. Each exec
holds a lease on the servers, taken before it looks at them (so an exec that ends meanwhile
sees it), and they are stopped when the last exec using them ends (and stop by themselves
within a second if every holder dies). A Ctrl-C stops only what its own exec owns.

An exec of a worker is judged by the run's state machine: when the chief's exec (another
terminal) has finished and this worker still waits a grace later, the exec says so, with the
late-worker cause where it applies, and with --grace it stops it. Each exec keeps a small
record (`.tflab/execs/TASK/`) that the others read: who runs, who has ended, how.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import uuid
from functools import partial
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tflab_guard import protocol

from tflab.engine import guardcmd, guardwait
from tflab.engine.attached import OLD_GUARD, End, Reattach
from tflab.engine.executors import Attached, Executor, OnOutput
from tflab.engine.metrics import ClusterSampler
from tflab.errors import EngineError, Interrupted, TflabError, UserError
from tflab.host.fanout import background, parallel
from tflab.host.leases import LEASES
from tflab.host.locks import file_lock
from tflab.plan import progress
from tflab.plan.topology import GRPC_PORT
from tflab.run import history
from tflab.run.drive import RECORD_EVERY_S, Every, drive
from tflab.run.events import Action, Began, Busy, Inspect, Interrupt, PeerEnded, Say, Stacks, Stop
from tflab.run.watch import ProcessWatch
from tflab.run.words import Verdict
from tflab.run.machine import RunMachine
from tflab.run.runplan import RunPlan

WATCH_S = 0.5
HOLD_TIMEOUT_S = 30.0
FORCE_WAIT_S = 10.0  # after the second Ctrl-C, how long a process that will not stop is waited on


@dataclass(frozen=True)
class ExecSetup:
    """What one exec runs."""

    task: str
    node: str
    servers: tuple[str, ...]
    commands: Mapping[str, str]
    env: Mapping[str, str]
    lock: Path  # the task's exec lock: one exec at a time looks at, starts or stops the servers
    records: Path  # the task's exec records
    runs_dir: Path  # the lab's runs folder on this host
    plan: RunPlan | None = None  # the worker's rules (None: a server or sidecar, not judged)
    resume: bool = False
    progress: str | None = None  # the task's own progress pattern
    ready_timeout_s: float = 120.0
    host_cpus: int = 1  # the host's CPUs (the node's CPU figures, for the stall rule, are shares of them)
    metrics: bool = True  # sample the node's CPU: what tells a stall from work (no figures: never called stalled)
    stop_grace_s: float = protocol.STOP_GRACE_S


@dataclass
class ExecResult:
    """How one exec ended."""

    code: int
    verdict: Verdict
    duration_s: float
    steps_per_s: float | None = None
    problem: str | None = None
    fresh: bool = False
    log: Path | None = None
    notes: list[str] = field(default_factory=list)
    quality: dict[str, float] = field(default_factory=dict)  # the metrics as the program last printed them
    result: str | None = None  # its own last meaningful line



class ExecSession:
    """Runs `setup.node`'s task to its end, and its verdict."""

    def __init__(self, executor: Executor, setup: ExecSetup, on_output: OnOutput,
                 say: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self.executor = executor
        self.setup = setup
        self.on_output = on_output
        self.say = say
        self.clock = clock
        self.pid = os.getpid()
        self.owner = f"{self.pid}-{uuid.uuid4().hex[:6]}"  # this exec, among the others (and in its key)
        self.records = history.ExecRecords(setup.records)
        self.lease_files: list[Path] = []  # its leases' files on the host, renewed while it goes on
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.holders: dict[str, Attached] = {}
        self.exec_nodes: set[str] = set()  # servers that another terminal runs as its own exec
        self.node_started = False
        self.started_wall = time.time()
        self.record: dict[str, Any] = {}

    def interrupt(self, reason: str = "interrupted", force: bool = False) -> None:
        """Stop this exec (called from a signal handler).

        While the servers start, it raises (the holders and started servers are released
        on the way out); once the node's process runs, that process is stopped first.
        """
        if not self.node_started:
            raise Interrupted(reason)
        self.events.put(Interrupt(self.clock(), reason, force))

    def run(self) -> ExecResult:
        setup = self.setup
        result: ExecResult | None = None
        try:
            with file_lock(setup.lock):
                others = self.records.live(exclude=self.owner)
                fresh = not others
                if setup.plan is None and self.executor.run(
                        setup.node, guardcmd.alive(protocol.serve_key(setup.task, setup.node)))[0] == 0:
                    users = sorted({str(r.get("node")) for r in others}) or ["another"]
                    raise UserError(f"{setup.node} already serves {setup.task} for the exec of {', '.join(users)}: a "
                                    f"second one would find its port taken; that exec stops it when it ends")
                self.exec_nodes = {str(r.get("node")) for r in others}
                folder = history.fresh_run_dir(setup.runs_dir, setup.task, resume=setup.resume or not fresh)
                if fresh:
                    self.say(f"{setup.task}: " + (f"resuming from the outputs in {folder}" if setup.resume
                                                 else f"a fresh session, outputs in {folder}"))
                if setup.servers:
                    self.lease_files.append(LEASES.hold(setup.runs_dir, protocol.exec_lease(setup.task)))
                    self._hold_and_start_servers(restart=fresh)
                self.record = {"task": setup.task, "node": setup.node, "id": self.owner, "pid": self.pid,
                               "pid_start": history.process_start(self.pid), "started": self.started_wall,
                               "ended": None, "exit_code": None, "fresh": fresh}
                self.records.write(setup.node, self.record)
            self._hint_chief()
            result = self._run_node(folder / history.LOG_DIR / f"{setup.node}.log")
            result.fresh = fresh
            return result
        finally:
            if self.record:
                self.record.update(ended=time.time(), exit_code=None if result is None else result.code,
                                   verdict=None if result is None else result.verdict)
                self.records.write(setup.node, self.record)
            if setup.servers:
                with file_lock(setup.lock):
                    self._release_servers()
            for path in self.lease_files:
                LEASES.release(path)

    # -- the servers -----------------------------------------------------------------------

    def _hold_and_start_servers(self, restart: bool) -> None:
        def again(argv: list[str], _out: int, _err: int) -> list[str]:
            return argv  # holding again is holding on: the holder's file is renewed where it was

        """Hold the servers (held before looked at), then start those that do not serve; wait until all accept."""
        setup = self.setup
        lease = protocol.exec_lease(setup.task)
        holding = {name: threading.Event() for name in setup.servers}
        old_guard: list[str] = []
        for name in setup.servers:
            said = bytearray()

            def on_output(chunk: bytes, _is_err: bool, name: str = name, said: bytearray = said) -> None:
                said.extend(chunk)
                if f"{protocol.HOLDING}\n".encode() in said:
                    holding[name].set()

            def on_exit(end: End, name: str = name, said: bytearray = said) -> None:
                if guardwait.is_old_guard(end.code, said.decode(errors="replace")):
                    old_guard.append(name)
                holding[name].set()  # never holding: the check below says so

            argv = guardcmd.hold(lease, self.owner)
            self.holders[name] = self.executor.start(name, argv, on_output, on_exit, workdir="/", renew=True,
                                                     resume=Reattach(partial(again, argv), end_line=False))
        deadline = self.clock() + HOLD_TIMEOUT_S
        for name, event in holding.items():
            event.wait(max(0.0, deadline - self.clock()))
            if old_guard:
                raise UserError(OLD_GUARD)
            if not event.wait(max(0.0, deadline - self.clock())) or self.holders[name].wait(0):
                raise EngineError(f"cannot hold {name}'s server for this exec: its guard did not answer; "
                                  f"is {name} running (`tflab status`)?")

        def start(name: str) -> bool:
            key = protocol.serve_key(setup.task, name)
            if name in self.exec_nodes:
                return False  # another terminal's `tflab exec NAME TASK` runs this server itself
            if not restart and self.executor.run(name, guardcmd.alive(key))[0] == 0:
                return False
            # A fresh session, or a server gone: nothing of an earlier one may serve it (nor answer for it).
            self.executor.run(name, guardcmd.stop([key], force=True, forget=True))
            log = f"/runs/{setup.task}/logs/{name}.log"
            self.executor.spawn(name, guardcmd.serve(key, lease, setup.commands[name], log),
                                env=setup.env, workdir="/workspace")
            return True

        started = dict(zip(setup.servers, parallel(start, setup.servers)))
        waits = dict(zip(setup.servers, parallel(
            lambda name: guardwait.await_serving(
                self.executor, name, None if name in self.exec_nodes else protocol.serve_key(setup.task, name),
                setup.ready_timeout_s, self.say),
            setup.servers)))
        for name in setup.servers:
            if waits[name].outcome == guardwait.ServeOutcome.ENDED:
                raise UserError(f"{name} exited before serving on port {GRPC_PORT}; its output is in "
                                f"the runs folder: {setup.task}/logs/{name}.log")
            if waits[name].outcome != guardwait.ServeOutcome.SERVING:
                raise UserError(f"{waits[name].problem}; its output is in the runs folder: {setup.task}/logs/{name}.log")
            how = ("its own exec, in another terminal: this exec joins it" if name in self.exec_nodes
                   else "started for this exec" if started[name] else "already serving: this exec joins it")
            self.say(f"{name} is serving on {name}:{GRPC_PORT} ({how})")

    def _release_servers(self) -> None:
        setup = self.setup
        for holder in self.holders.values():
            holder.close()
        for holder in self.holders.values():
            holder.wait(5)
        for name in self.holders:
            if name in self.exec_nodes:
                continue  # its own exec ends it
            try:
                if self.executor.run(name, guardcmd.has_holders(protocol.exec_lease(setup.task)))[0] == 0:
                    self.say(f"{name} keeps serving: another exec of {setup.task} uses it")
                    continue
                self.executor.run(name, guardcmd.stop([protocol.serve_key(setup.task, name)], setup.stop_grace_s))
            except TflabError:
                continue  # the node is gone; its server went with it
            self.say(f"stopped {name}")

    # -- the node's own process --------------------------------------------------------------

    def _hint_chief(self) -> None:
        plan = self.setup.plan
        if plan is None or plan.chief == self.setup.node:
            return
        if not any(r.get("node") == plan.chief for r in self.records.live(exclude=self.owner)):
            self.say(f"{self.setup.node} trains with the chief, {plan.chief}, which no exec runs yet: "
                     f"start `tflab exec {plan.chief} {self.setup.task}` in another terminal (or use "
                     f"`tflab run {self.setup.task}`)")

    def _watch_chief(self, stop: threading.Event) -> None:
        """Tell the machine when the chief's exec (another terminal) has finished, while this one runs."""
        chief = self.setup.plan.chief if self.setup.plan else None
        while chief and not stop.wait(WATCH_S):
            for record in self.records.all():
                if (record.get("node") == chief and record.get("ended") is not None
                        and record["ended"] > self.started_wall):
                    self.events.put(PeerEnded(chief, record.get("exit_code"), self.clock()))
                    return

    def _never_joined(self) -> str:
        """Who of the task's cluster runs no exec of it now (the others wait for them), and what starts them."""
        setup = self.setup
        live = {str(record.get("node")) for record in self.records.live(exclude=self.owner)}
        missing = [name for name in setup.commands if name != setup.node and name not in setup.servers
                   and name not in live]
        if not missing:
            return "every node of the task runs an exec of it: where each waits, its stack above"
        first = missing[0]
        return (f"{', '.join(missing)} {'runs' if len(missing) == 1 else 'run'} no exec of {setup.task}, and this one "
                f"waits for {'it' if len(missing) == 1 else 'them'}: `tflab exec {first} {setup.task}` in another "
                f"terminal starts {first}, or `tflab run {setup.task}` runs them all")

    def _force_stop(self, key: str) -> None:
        """The second Ctrl-C: the node's process group killed now (an engine that cannot is said, not raised)."""
        try:
            self.executor.run(self.setup.node, guardcmd.stop([key], force=True))
        except TflabError as exc:
            self.say(f"could not kill {self.setup.node}'s {self.setup.task}: {exc}")

    def _run_node(self, log_path: Path) -> ExecResult:
        setup = self.setup
        key = protocol.exec_key(setup.task, setup.node, self.owner)
        argv = guardcmd.run_line(key, setup.commands[setup.node], grace_s=setup.stop_grace_s)
        plan = setup.plan or RunPlan(servers=(), finishers=(setup.node,), chief=setup.node, stop_hung=False)
        machine = RunMachine(plan)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log: IO[bytes] = log_path.open("ab")
        watch = ProcessWatch(setup.node, key, self.executor, self.events, self.clock, setup.progress)

        def on_output(chunk: bytes, is_err: bool) -> None:
            log.write(chunk)
            log.flush()
            watch.output(chunk, is_err)
            self.on_output(chunk, is_err)

        began = self.clock()
        first = machine.handle(Began(began))
        self.lease_files.append(LEASES.hold(setup.runs_dir, key))
        self.node_started = True  # from here on an interrupt is queued, and handled below
        process = self.executor.start(setup.node, argv, on_output, watch.exited, env=setup.env, renew=True,
                                      resume=guardcmd.reattach(key))
        watching = threading.Event()
        background(self._watch_chief, watching, name="watch-chief")
        forced_at: list[float | None] = [None]

        def carry_out(actions: list[Action]) -> None:
            for action in actions:  # the node's start and release are the process started above
                if isinstance(action, Say):
                    self.say(action.message)
                elif isinstance(action, Inspect) and setup.node in action.nodes:
                    background(inspect, name="inspect")
                elif isinstance(action, Stop):
                    if action.force:
                        forced_at[0] = forced_at[0] or self.clock()
                        background(self._force_stop, key, name="force-stop")
                    process.close()  # the guard stops the process group: TERM, then KILL

        def inspect() -> None:
            """Where this node's process waits (its stacks), kept in its log and told to the machine."""
            dump, problem = guardwait.stack_of(self.executor, setup.node, key)
            if dump:
                try:
                    log.write(f"--- tflab: where {setup.node} waits (py-spy dump) ---\n{dump.rstrip()}\n".encode())
                    log.flush()
                except ValueError:
                    pass  # the exec has ended meanwhile, its log closed
            self.events.put(Stacks(setup.node, self.clock(), dump, problem))

        def keep_record(now: float) -> None:
            if self.record:  # its steps/s kept current for `tflab top`
                rate = machine.nodes[setup.node].rate(history.RECENT_S)
                self.record["steps_per_s"] = None if rate is None else round(rate, 2)
                self.records.write(setup.node, self.record)

        def give_up(now: float) -> str | None:
            if forced_at[0] is None or now - forced_at[0] <= FORCE_WAIT_S or not machine.running():
                return None
            # a frozen (paused) node's process cannot be stopped: say so and leave, as `run` does
            self.say(f"{setup.node} did not stop within {FORCE_WAIT_S:g}s of the second Ctrl-C (is it "
                     "paused? `tflab fault clear`); left to the node")
            return "did not stop; left running"

        # No exec waits in silence: the node's CPU figures feed the run's stall rule, as a run's cluster figures do.
        sampler = ClusterSampler(self.executor, [setup.node], setup.host_cpus, every_s=1.0,
                                 on_snapshot=lambda snap: self.events.put(Busy(self.clock(), tuple(
                                     (name, figures.cpu_used) for name, figures in snap.nodes.items()))))
        if setup.metrics and setup.plan is not None:
            background(sampler.start, name="exec-metrics")
        try:
            carry_out(first)
            drive(machine, self.events, carry_out, self.clock, every=(Every(RECORD_EVERY_S, keep_record),),
                  give_up=give_up)
        finally:
            sampler.close()
            watching.set()
            log.close()
        node = machine.nodes[setup.node]
        verdict = machine.verdict_of(setup.node)
        problem = verdict.problem
        if verdict.verdict == Verdict.STALLED:
            problem = f"{problem}; {self._never_joined()}"
        return ExecResult(verdict.exit_code, verdict.verdict, (node.ended or self.clock()) - began, node.rate(),
                          problem, log=log_path, quality={metric: value for _t, metric, value in node.quality},
                          result=watch.last_line)
