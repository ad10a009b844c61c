"""A run's decisions as a pure state machine: events in, actions out, no I/O and no clock.

The launcher feeds it what happens (a node's process started, printed a step, exited; a
server accepts; time passes; the user interrupts) and carries out what it returns (start,
release, stop, say, finish). Every verdict is decided here, from events alone, so it can
be tested with literal event lists.

The rules (DESIGN.md, "Tasks"):
- servers start first; the finishers (workers, chief) start held and are released once
  every server accepts on its port; sidecars (the evaluator) run beside them;
- the run succeeds when every finisher exited 0; then servers and sidecars are stopped;
- a finisher that fails stops the run (unless a restart is allowed), as does a server
  that exits while the finishers run, or one that never serves (its wait, guardwait.await_serving,
  says so: not serving past the ready timeout and using no CPU; one still busy starting is waited for);
- after the chief finished, a finisher still running is hung once it has been silent for
  the grace period; one that never printed a step may be sleeping through TF1's
  MonitoredTrainingSession recovery wait (30 s), so it gets that much longer, and if it
  is still waiting then, the verdict names the cause and the cure (`device_filters`);
- a correct program is never called failed or hung: a late worker that ends after the
  chief (even 35 s after) is `ok`, and one that trained and then waits in TensorFlow's
  teardown for the coordination service that ended with the chief is stopped as finished;
- no run waits in silence: where finishers have printed no step, and no node of the run printed
  a line of its own or used more than a sliver of a CPU for `stall_s` (the cluster's figures must
  cover that time), the run is `stalled`: those finishers are named, every node is asked (Check)
  whether it reaches the others' ports before they stop. A program that computes or prints is
  never stalled (a slow import uses the CPU; a ps that only serves beside busy workers is no stall).

The words it hears and says are in run/events.py, the plan it judges by in run/runplan.py,
the drill's faults it tracks in run/drills.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from tflab_guard import protocol

from tflab.host import signals
from tflab.plan.faults import ENDS_PROCESS
from tflab.plan.topology import GRPC_PORT
from tflab.run.drills import DrillState, Drills, describe
from tflab.run.events import (
    Action,
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
    Printed,
    PeerEnded,
    Release,
    Revive,
    Revived,
    Say,
    Serving,
    Stacks,
    Start,
    Stop,
    Tick,
)
from tflab.run.noderun import NodeRun
from tflab.run.runplan import FINISHER, SERVER, SIDECAR, RunPlan
from tflab.run.stalls import StallRule
from tflab.run.verdicts import how_it_ended, hung_message, node_verdict, served_message, teardown_message
from tflab.run.waits import WaitKind, where_it_waits
from tflab.run.words import Verdict

# How long a decision waits for the stacks it asked for (Inspect); then it is made without them, and says so.
INSPECT_WAIT_S = 20.0


@dataclass(frozen=True)
class Deferred:
    """A run's end that waits for the stacks of its nodes still running (a stall, a timeout): then `_end(*end)`."""

    nodes: tuple[str, ...]
    asked: float
    end: tuple[Verdict, int, str, Verdict]


def failed_by_itself(event: Exited) -> Verdict | None:
    """FAILED (or OOM) where the node's own record says its process failed by itself: it exited with a code other
    than 0, crashed, or the kernel's out-of-memory killer ended it; None otherwise (tflab stopped it, it succeeded,
    a signal from outside, or no record says)."""
    if event.ended_by == protocol.OOM:
        return Verdict.OOM
    if event.ended_by == protocol.CRASHED or (event.ended_by == protocol.EXITED and event.code not in (None, 0)):
        return Verdict.FAILED
    return None


class RunMachine:
    """The verdict of one run, decided from events."""

    def __init__(self, plan: RunPlan) -> None:
        self.plan = plan
        self.nodes: dict[str, NodeRun] = {}
        for name in plan.servers:
            self.nodes[name] = NodeRun(name, SERVER)
        for name in plan.sidecars:
            self.nodes[name] = NodeRun(name, SIDECAR)
        for name in plan.finishers:
            self.nodes[name] = NodeRun(name, FINISHER)
        self.began: float | None = None
        self.released = False
        self._released_t: float | None = None
        self.chief_ended: float | None = None
        self.restarts = {name: 0 for name in plan.finishers}
        self.finish: Finish | None = None
        self.hung_reported: set[str] = set()
        self.problems: list[str] = []
        self.drills = Drills(plan.faults, plan.drill_stall_s)
        self.run_step: int | None = None  # the furthest step a finisher reported
        self.down: set[str] = set()  # nodes whose machine a fault took down (waiting to be revived)
        self.reviving: set[str] = set()
        self.injecting: dict[str, int] = {}  # node -> the fault being done to its machine (no answer yet)
        self.held_exits: dict[str, Exited] = {}  # exits seen while their node's fault was being done
        # nodes the drill took down that are back (rebooted, or revived) before their old process's end was
        # seen: that end, when it comes, is the drill's, and starts the node again
        self.back_before_end: dict[str, DrillState] = {}
        self.gang: set[str] = set()  # finishers being stopped for a restart of them all
        self.gang_restarts = 0
        self.stall_rule = StallRule(plan.stall_s)
        self.inspecting: dict[str, float] = {}  # nodes whose stacks were asked for (Inspect), and when
        self.hung_pending: dict[str, float] = {}  # finishers past the chief's grace, judged once their stacks come
        self.deferred: Deferred | None = None

    # -- the one entry point -------------------------------------------------------------------

    def handle(self, event: Event) -> list[Action]:
        """The actions `event` calls for."""
        if isinstance(event, Began):
            return self._began(event)
        if isinstance(event, Printed):
            return self._output(event)
        if isinstance(event, Serving):
            return self._serving(event)
        if isinstance(event, NotServing):
            return self._not_serving(event)
        if isinstance(event, Exited):
            if event.node in self.injecting:
                # The node's stream ended while its machine is being killed: whose doing that was is
                # known when the injector answers (its `docker kill` returns after the stream ends).
                self.held_exits[event.node] = event
                return []
            return self._exited(event)
        if isinstance(event, PeerEnded):
            return self._peer_ended(event)
        if isinstance(event, Busy):
            return self._busy(event)
        if isinstance(event, Tick):
            return self._tick(event.t)
        if isinstance(event, Interrupt):
            return self._interrupted(event)
        if isinstance(event, Injected):
            return self._injected(event)
        if isinstance(event, Healed):
            return self._healed(event)
        if isinstance(event, Revived):
            return self._revived(event)
        if isinstance(event, Stacks):
            return self._stacks(event)
        raise TypeError(f"not an event: {event!r}")

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def verdict_of(self, name: str) -> Finish:
        """The decided run as one node's `tflab exec` reports it (run/verdicts.py)."""
        assert self.finish is not None, "the run is not decided yet"
        return node_verdict(self.finish, self.nodes[name])

    def running(self) -> list[str]:
        """Nodes whose process has started and not yet ended (held ones included)."""
        return [n.name for n in self.nodes.values() if n.attempt > 0 and n.ended is None]

    # -- events ----------------------------------------------------------------------------

    def _began(self, event: Began) -> list[Action]:
        self.began = event.t
        actions: list[Action] = []
        first = self.plan.servers + self.plan.sidecars
        for name in first:
            self._mark_started(name, event.t)
        if first:
            actions.append(Start(first))
        for name in self.plan.finishers:
            self.nodes[name].attempt = 1
            self.nodes[name].verdict = Verdict.HELD
        if not self.plan.servers:
            actions.append(Start(self.plan.finishers))
            actions += self._release(event.t, announce=False)
        else:
            actions.append(Start(self.plan.finishers, held=True))
        return actions

    def _mark_started(self, name: str, t: float) -> None:
        node = self.nodes[name]
        node.attempt += 1
        node.started, node.ended, node.exit_code, node.reason = t, None, None, None
        node.verdict = Verdict.RUNNING

    def _release(self, t: float, announce: bool = True) -> list[Action]:
        self.released = True
        self._released_t = t
        for name in self.plan.finishers:
            node = self.nodes[name]
            if node.ended is None:
                node.started, node.verdict = t, Verdict.RUNNING
        actions: list[Action] = []
        if announce:
            actions.append(Say(f"starting {', '.join(self.plan.finishers)}"))
            actions.append(Release(self.plan.finishers))
        return actions

    def _serving(self, event: Serving) -> list[Action]:
        node = self.nodes.get(event.node)
        if self.finished or node is None or node.role != SERVER or node.serving or node.ended is not None:
            return []
        node.serving = True
        actions: list[Action] = [Say(f"{event.node} is serving on {event.node}:{GRPC_PORT}")]
        if not self.released and all(self.nodes[s].serving for s in self.plan.servers):
            actions += self._release(event.t)
        return actions

    def _not_serving(self, event: NotServing) -> list[Action]:
        """A server's wait ended without it serving (guardwait.await_serving says why): before the workers start,
        the run fails so; after (a server started again by a drill), it is said."""
        node = self.nodes.get(event.node)
        if self.finished or node is None or node.role != SERVER or node.serving or node.ended is not None:
            return []
        if self.released:
            return [Say(event.problem)]
        return self._fail(event.problem)

    def _output(self, event: Printed) -> list[Action]:
        node = self.nodes.get(event.node)
        if node is None:
            return []
        node.last_output = event.t
        if not event.runtime:
            node.last_said = event.t
        if event.leader_gone:
            node.leader_gone = event.t
        if event.step is not None:
            node.steps.append((event.t, event.step))
        if event.rate is not None:
            node.rates.append((event.t, event.rate))
        if event.global_step is not None:
            node.global_steps.append((event.t, event.global_step))
        if event.global_rate is not None:
            node.global_rates.append((event.t, event.global_rate))
        for metric, value in event.quality:
            node.quality.append((event.t, metric, value))
        reached = event.global_step if event.global_step is not None else event.step  # the run's: the cluster's
        if reached is not None and event.node in self.plan.finishers:
            self.run_step = max(self.run_step or 0, reached)
            return self._due(event.t)
        return []

    def _exited(self, event: Exited) -> list[Action]:
        node = self.nodes.get(event.node)
        if node is None or node.ended is not None:
            return []
        node.ended, node.exit_code = event.t, event.code
        if node.started is None:
            node.started = event.t  # ended while held
        node.reason, node.signal, node.ended_by = event.reason, event.signal, event.ended_by
        if event.node in self.gang and not self.finished:
            return self._gang_member_ended(node, event)
        if event.node in self.back_before_end:
            return self._drilled_exit(node, event, self.back_before_end.pop(event.node))
        failed_itself = failed_by_itself(event)
        if failed_itself is not None and node.verdict in (Verdict.STOPPED, Verdict.RUNNING, Verdict.HELD) and (
                node.verdict == Verdict.STOPPED or self.finished):
            # The run had ended for another reason (a worker that failed a moment before), but its own record says
            # it failed by itself: failed (or oom), never `stopped`, whatever failed first.
            node.verdict = failed_itself
            return self._maybe_done()
        if node.verdict not in (Verdict.RUNNING, Verdict.HELD):
            # Stopped on purpose (served, stopped, hung, interrupted ...): the verdict stands.
            return self._maybe_done()
        if self.finished:
            node.verdict = Verdict.STOPPED
            return []
        how = how_it_ended(event)
        if event.ended_by == protocol.OOM:
            return self._oom(node, event)
        drilled = self.drills.downed(event.node)
        if drilled is not None or event.node in self.down:
            return self._drilled_exit(node, event, drilled)
        if node.role == SERVER:
            node.verdict = Verdict.FAILED
            when = "while the workers were running" if self.released else f"before serving on port {GRPC_PORT}"
            return self._fail(f"{event.node} {how} {when}")
        if node.role == SIDECAR:
            node.verdict = Verdict.OK if event.code == 0 else Verdict.FAILED
            return [] if event.code == 0 else [Say(f"{event.node} {how}; the run goes on without it")]
        if event.code == 0:
            node.verdict = Verdict.OK
            if event.node == self.plan.chief:
                self.chief_ended = event.t
            return self._maybe_done()
        if self.plan.gang_restart and self.gang_restarts < self.plan.restarts and event.code is not None:
            node.verdict = Verdict.RESTARTED
            return self._gang_restart(f"{event.node} {how}")
        if event.node != self.plan.chief and self.restarts[event.node] < self.plan.restarts and event.code is not None:
            self.restarts[event.node] += 1
            node.verdict = Verdict.RESTARTED
            self._mark_started(event.node, event.t)
            return [
                Say(f"{event.node} {how}; restart {self.restarts[event.node]} of {self.plan.restarts}"),
                Start((event.node,), attempt=node.attempt),
            ]
        node.verdict = Verdict.FAILED
        return self._fail(f"{event.node} failed: {how}" if event.code is None
                          else f"{event.node} failed with exit code {event.code}"
                          + (f" ({event.reason})" if event.reason else ""))

    def _peer_ended(self, event: PeerEnded) -> list[Action]:
        if event.node != self.plan.chief or self.chief_ended is not None or self.finished:
            return []
        if event.code == 0:
            self.chief_ended = event.t
            return [Say(f"the chief ({event.node}) has finished")]
        # As in a run, a failed worker ends the training: this exec's worker would wait on it for ever.
        how = f"exited with {event.code}" if event.code is not None else "ended with no exit code"
        problem = f"the chief ({event.node}) {how} in its own exec; the training cannot go on without it"
        self.problems.append(problem)
        return self._end(Verdict.FAILED, 1, problem, verdict_for_running=Verdict.STOPPED)

    def _busy(self, event: Busy) -> list[Action]:
        self.stall_rule.heard(event, self.nodes)
        return []

    def _oom(self, node: NodeRun, event: Exited) -> list[Action]:
        node.verdict = Verdict.OOM
        limit = self.plan.memory_limits.get(event.node)
        problem = (f"{event.node} ran out of memory: the kernel's out-of-memory killer ended it "
                   + (f"at its node's limit of {limit}" if limit else "(its node has no limit: the host itself ran out)"))
        if node.role == SIDECAR:
            return [Say(f"{problem}; the run goes on without it")]
        self.problems.append(problem)
        return self._end(Verdict.OOM, 1, problem, verdict_for_running=Verdict.STOPPED)

    def _tick(self, t: float) -> list[Action]:
        if self.finished or self.began is None:
            return []
        plan = self.plan
        if self.deferred is not None:
            return self._decide(t)
        if plan.timeout_s is not None and t - self.began > plan.timeout_s:
            return self._end_after_stacks(t, (Verdict.TIMEOUT, 1, f"the run passed its timeout of {plan.timeout_s:g}s",
                                              Verdict.TIMEOUT))
        drill, stalled = self._drill_tick(t)
        if stalled:
            return drill
        waiting = self._stalled(t)
        if waiting:
            return drill + self._stall(waiting, t)
        if self.chief_ended is None:
            return drill
        hung: list[str] = []
        finished: list[str] = []
        for name in plan.finishers:
            node = self.nodes[name]
            if not node.running or name in self.hung_reported or name in self.hung_pending:
                continue
            if node.progressed:
                quiet_since = max(self.chief_ended, node.last_output or self.chief_ended)
                deadline = quiet_since + plan.grace_s
            else:
                deadline = self.chief_ended + plan.recovery_wait_s + plan.grace_s
            if t > deadline:
                (finished if self._tearing_down(node) else hung).append(name)
        actions: list[Action] = drill
        for name in finished:
            self.hung_reported.add(name)
            message = teardown_message(self.plan, name, t - (self.chief_ended or t))
            actions.append(Say(message))
            if plan.stop_hung:
                self.nodes[name].verdict, self.nodes[name].reason = Verdict.OK, message
        if hung:  # where each waits is read before anything is said of it
            for name in hung:
                self.hung_pending[name] = self.inspecting[name] = t
            actions.append(Inspect(tuple(hung)))
        if finished and plan.stop_hung:
            actions.append(Stop(tuple(finished)))
        return actions + self._decide(t) + (self._maybe_done() if finished and plan.stop_hung else [])

    def _stacks(self, event: Stacks) -> list[Action]:
        """A node's stacks, asked for: kept, said, and what waited on them decided."""
        node = self.nodes.get(event.node)
        if node is None or self.inspecting.pop(event.node, None) is None:
            return []
        node.stack, node.wait = event.dump, where_it_waits(event.dump)
        said = (node.wait.sentence(event.node) if node.wait.known
                else f"where {event.node} waits could not be read" + (f": {event.problem}" if event.problem else ""))
        return [Say(said)] + self._decide(event.t)

    def _heard(self, name: str, asked: float, t: float) -> bool:
        """Whether `name`'s stacks came, or were waited for long enough."""
        return name not in self.inspecting or t - asked > INSPECT_WAIT_S

    def _decide(self, t: float) -> list[Action]:
        """What waited on stacks, decided once they came (or were waited for long enough)."""
        if self.finished:
            self.deferred = None
            self.hung_pending.clear()
            return []
        if self.deferred is not None:
            deferred = self.deferred
            if not all(self._heard(name, deferred.asked, t) for name in deferred.nodes):
                return []
            self.deferred = None
            verdict, code, problem, for_running = deferred.end
            return self._end(verdict, code, problem, verdict_for_running=for_running)
        ready = [name for name, asked in self.hung_pending.items() if self._heard(name, asked, t)]
        if not ready:
            return []
        plan = self.plan
        actions: list[Action] = []
        stopped: list[str] = []
        for name in ready:
            del self.hung_pending[name]
            self.inspecting.pop(name, None)
            node = self.nodes[name]
            if not node.running:
                continue  # it ended while its stacks were read: its end speaks for it
            self.hung_reported.add(name)
            if node.wait is not None and node.wait.kind == WaitKind.SERVES and not node.progressed:
                # A worker that only serves (server.join(), as the operator's smoke tests do) when the chief has
                # succeeded: a server, stopped as a ps is (a TFJob succeeds with its chief).
                message = served_message(plan, name)
                actions.append(Say(message))
                if plan.stop_hung:
                    node.verdict, node.reason = Verdict.SERVED, message
                    stopped.append(name)
                continue
            message = hung_message(plan, node, t, self.chief_ended)
            if not plan.stop_hung:
                actions.append(Say(message))  # said once; stopping it is the user's call
                continue
            node.verdict = Verdict.HUNG
            node.reason = message
            self.problems.append(message)
            stopped.append(name)
        if stopped:
            actions.append(Stop(tuple(stopped)))
        return actions + (self._maybe_done() if stopped else [])

    def _end_after_stacks(self, t: float, end: tuple[Verdict, int, str, Verdict]) -> list[Action]:
        """End the run once the stacks of its nodes still running are read (where each waited), or now."""
        still = tuple(name for name in self.running() if self.nodes[name].started is not None)
        if not still:
            verdict, code, problem, for_running = end
            return self._end(verdict, code, problem, verdict_for_running=for_running)
        for name in still:
            self.inspecting[name] = t
        self.deferred = Deferred(still, t, end)
        return [Inspect(still)]

    def _stalled(self, t: float) -> list[str]:
        """The finishers that never printed a step, where nothing of the run printed or computed for stall_s (not
        while a drill or a restart is under way: they have rules of their own)."""
        if not self.released or self._released_t is None or self.drills or self.gang or self.reviving:
            return []
        return self.stall_rule.waiting(t, self._released_t, self.nodes, self.plan.finishers)

    def _stall(self, waiting: list[str], t: float) -> list[Action]:
        """The run is stalled: who waits is named, every node asked who it reaches and where it waits (its stacks),
        then everything stops."""
        silence = f"{self.plan.stall_s:g}s"
        for name in waiting:
            node = self.nodes[name]
            node.verdict = Verdict.STALLED
            node.reason = f"printed no step, and no node of the run printed or computed for {silence}"
        problem = (f"the run is stalled: {', '.join(waiting)} printed no step, and no node of it printed a line or "
                   f"used the CPU for {silence} (--stall): they wait for something that does not come")
        self.problems.append(problem)
        for name in waiting:
            self.inspecting[name] = t
        self.deferred = Deferred(tuple(waiting), t, (Verdict.STALLED, 1, problem, Verdict.STOPPED))
        return [Check(tuple(self.running()), tuple(waiting)), Inspect(tuple(waiting))]

    def _tearing_down(self, node: NodeRun) -> bool:
        """A finisher that trained, and whose runtime then called the chief's coordination service after the
        chief ended cleanly: its work is done, it is in TensorFlow's teardown (slow on a starved node)."""
        return node.progressed and node.leader_gone is not None and self.chief_ended is not None

    def _interrupted(self, event: Interrupt) -> list[Action]:
        if self.finished:
            still = tuple(self.running())
            return [Stop(still, force=True)] if event.force and still else []
        verdict = Verdict.STOPPED if event.reason in signals.ON_PURPOSE else Verdict.INTERRUPTED
        return self._end(verdict, 130, event.reason, verdict_for_running=verdict, force=event.force)

    # -- endings ---------------------------------------------------------------------------

    def _maybe_done(self) -> list[Action]:
        if self.finished:
            return []
        if self.gang or self.reviving or self.down & set(self.plan.finishers) - self._gone_for_good():
            return []  # a restart of the drill (or of --restarts) is on its way
        finishers = [self.nodes[n] for n in self.plan.finishers if n not in self._gone_for_good()]
        if any(n.ended is None for n in finishers):
            return []  # still running, or hung and being stopped: their exits end the run
        if not finishers:
            return self._end(Verdict.FAILED, 1, "the drill took down every worker", verdict_for_running=Verdict.STOPPED)
        if all(n.verdict in (Verdict.OK, Verdict.SERVED) for n in finishers) and any(
                n.verdict == Verdict.OK for n in finishers):
            return self._end(Verdict.OK, 0, None, verdict_for_running=Verdict.SERVED)
        if any(n.verdict == Verdict.HUNG for n in finishers):
            return self._end(Verdict.HUNG, 1, "; ".join(self.problems), verdict_for_running=Verdict.STOPPED)
        return self._end(Verdict.FAILED, 1, "; ".join(self.problems) or "not every worker succeeded",
                         verdict_for_running=Verdict.STOPPED)

    def _gone_for_good(self) -> set[str]:
        """Finishers a drill took down that come back neither by the drill nor by --restarts: the run goes on without them."""
        return {n for n in self.down if n not in self.reviving and self.nodes[n].role == FINISHER
                and self.nodes[n].ended is not None}

    def _fail(self, problem: str) -> list[Action]:
        return self._end(Verdict.FAILED, 1, problem, verdict_for_running=Verdict.STOPPED)

    def _end(self, verdict: Verdict, code: int, problem: str | None, verdict_for_running: Verdict,
             force: bool = False) -> list[Action]:
        still = self.running()
        for name in still:
            node = self.nodes[name]
            if node.verdict in (Verdict.RUNNING, Verdict.HELD):
                role_verdict = verdict_for_running
                if verdict_for_running == Verdict.SERVED and node.role == SIDECAR:
                    role_verdict = Verdict.STOPPED
                node.verdict = role_verdict
        self.finish = self.drills.judge(Finish(code, verdict, problem), self.plan.expect)
        actions: list[Action] = []
        if still:
            actions.append(Stop(tuple(still), force=force))
        actions.append(self.finish)
        return actions

    # -- drills: when a fault is due, what its answer does to the run, how a node it took down starts again --

    def _drill_tick(self, t: float) -> tuple[list[Action], bool]:
        """Time passed: the drill's faults due and heals due; and whether the training stalled after one
        (then the run has failed, and True says so)."""
        if not self.drills:
            return [], False
        drill = self._due(t) + [Heal(i) for i in self.drills.heal_due(t)]
        self.drills.note_steps(self._steps())
        # output tflab cannot read as steps is still a sign the training goes on
        last = [n.last_active for n in (self.nodes[f] for f in self.plan.finishers) if n.last_active]
        stalled = self.drills.stalled(t, max(last) if last else None)
        if stalled is None or self.gang or self.reviving:
            return drill, False
        return drill + self._fail(f"no worker made progress in {self.plan.drill_stall_s:g}s after the drill's "
                                  f"{describe(stalled)}: the training did not recover from it"), True

    def _steps(self) -> dict[str, int | None]:
        return {name: (self.nodes[name].steps[-1][1] if self.nodes[name].steps else None)
                for name in self.plan.finishers}

    def _due(self, t: float) -> list[Action]:
        if self.finished or not self.drills:
            return []
        released = self.began if not self.plan.servers else self._released_t
        due = self.drills.due(t, released if self.released else None, self.run_step, self._steps())
        for index in due:
            fault = self.drills.states[index].fault
            if fault.action in ENDS_PROCESS:
                self.injecting[fault.node] = index
        return [Inject(i) for i in due]

    def _injected(self, event: Injected) -> list[Action]:
        state = self.drills.states[event.index]
        self.drills.hit(event.index, event.began if event.began is not None else event.t, event.t, event.done,
                        event.error)
        fault = state.fault
        if self.injecting.get(fault.node) == event.index:
            del self.injecting[fault.node]
        held = self.held_exits.pop(fault.node, None)
        if event.error is not None:
            said: list[Action] = [Say(f"drill: {fault.describe()} could not be done: {event.error}")]
            return said + (self._exited(held) if held is not None else [])  # an exit of its own, then
        actions: list[Action] = [Say(f"drill: {event.done} at {describe(state).split(' at ', 1)[1]}")]
        if fault.action in ("kill", "stop"):
            self.down.add(fault.node)
            if fault.then_restart:
                self.reviving.add(fault.node)
                actions.append(Revive(fault.node))
            return actions + (self._exited(held) if held is not None else [])
        if fault.action == "restart":
            # The injector answers once the machine is up again: its process starts again as soon as
            # the old one is seen gone (now, if it was, or when it is).
            self.down.add(fault.node)
            if held is not None:
                actions += self._exited(held)
            self.drills.back(fault.node, event.t)
            self.down.discard(fault.node)
            if self.nodes[fault.node].ended is None:
                self.back_before_end[fault.node] = state
            actions += self._restart_after_drill(fault.node, event.t)
        return actions

    def _healed(self, event: Healed) -> list[Action]:
        self.drills.heal(event.index, event.t, event.done, self._steps())
        return [Say(f"drill: {event.done}")] if event.done else []

    def _revived(self, event: Revived) -> list[Action]:
        self.reviving.discard(event.node)
        if event.error is not None:
            self.down.discard(event.node)
            return self._fail(f"{event.node} could not be brought back after the drill: {event.error}")
        self.drills.back(event.node, event.t)
        self.down.discard(event.node)
        actions: list[Action] = [Say(f"drill: {event.node} is back")]
        if self.gang:
            return actions + self._gang_ready(event.t)
        drilled = self.drills.last_on(event.node)
        if self.nodes[event.node].ended is None and drilled is not None:
            # Back before its killed process's end reached tflab (the engine tells of a killed exec late):
            # that end is still the drill's, not a failure of the node's own.
            self.back_before_end[event.node] = drilled
        return actions + self._restart_after_drill(event.node, event.t)

    def _restart_after_drill(self, name: str, t: float) -> list[Action]:
        """A node the drill downed is back: its process starts again once the old one is seen gone."""
        node = self.nodes[name]
        if self.finished or node.ended is None or name in self.down:
            return []
        self._mark_started(name, t)
        if node.role == SERVER:
            node.serving = False
        return [Say(f"{name} starts again (attempt {node.attempt})"), Start((name,), attempt=node.attempt)]

    def _drilled_exit(self, node: NodeRun, event: Exited, state: DrillState | None) -> list[Action]:
        """A process the drill ended: not a failure of its own; it comes back if the drill or --restarts says so."""
        fault = state.fault if state is not None else None
        node.verdict = {"kill": Verdict.KILLED, "stop": Verdict.SHUT_DOWN, "restart": Verdict.REBOOTED}.get(
            fault.action if fault else "kill", Verdict.KILLED)
        node.reason = f"by the drill ({fault.describe()})" if fault else "by the drill"
        if node.ended_by == protocol.OUTSIDE:
            node.ended_by = protocol.STOPPED  # the drill's signal is tflab's own, sent on purpose
        if fault is not None and (fault.then_restart or fault.action == "restart"):
            return self._restart_after_drill(node.name, event.t) if node.name not in self.down else []
        if node.role == FINISHER and self.plan.restarts:
            if self.plan.gang_restart and self.gang_restarts < self.plan.restarts:
                return self._gang_restart(f"{node.name} was ended by the drill")
            if node.name != self.plan.chief and self.restarts[node.name] < self.plan.restarts:
                self.restarts[node.name] += 1
                self.reviving.add(node.name)
                return [Say(f"{node.name} was ended by the drill; restart {self.restarts[node.name]} of "
                            f"{self.plan.restarts}"), Revive(node.name)]
        return self._maybe_done()

    def _gang_restart(self, why: str) -> list[Action]:
        """Every worker stops, and all start again together once the last is gone (and every machine is back)."""
        self.gang_restarts += 1
        self.gang = set(self.plan.finishers)
        still = tuple(n for n in self.plan.finishers if self.nodes[n].running)
        for name in still:
            self.nodes[name].verdict = Verdict.RESTARTING
        actions: list[Action] = [Say(f"{why}; restarting every worker together (an all-reduce job trains in "
                                     f"lockstep), restart {self.gang_restarts} of {self.plan.restarts}")]
        for name in sorted(self.down - self.reviving):
            self.reviving.add(name)
            actions.append(Revive(name))
        if still:
            actions.append(Stop(still))
        return actions + self._gang_ready(None)

    def _gang_member_ended(self, node: NodeRun, event: Exited) -> list[Action]:
        node.verdict = Verdict.RESTARTING
        return self._gang_ready(event.t)

    def _gang_ready(self, t: float | None) -> list[Action]:
        if any(self.nodes[n].ended is None for n in self.gang) or self.reviving or t is None:
            return []
        names = tuple(sorted(self.gang, key=self.plan.finishers.index))
        self.gang = set()
        for name in names:
            self._mark_started(name, t)
        attempt = max(self.nodes[n].attempt for n in names)
        return [Say(f"starting {', '.join(names)} again (attempt {attempt})"), Start(names, attempt=attempt)]
