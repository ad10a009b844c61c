"""The run state machine's decisions about drills: when a fault is due, what its answer does to the run,
and how a node (or every worker of an all-reduce job) it took down starts again.

`DrillRules` is the part of `RunMachine` (run/machine.py) that hears a drill's events; the
machine's own state is declared here for the type checker. Pure: no I/O, no clock.
"""

from __future__ import annotations

from tflab.plan.faults import ENDS_PROCESS
from tflab.run.drills import DrillState, Drills, describe
from tflab.run.events import Action, Exited, Heal, Healed, Inject, Injected, Revive, Revived, Say, Start, Stop

from tflab.run.noderun import NodeRun
from tflab.run.runplan import FINISHER, SERVER, RunPlan


class DrillRules:
    """A drill's events, as the run's machine decides them."""

    plan: RunPlan
    nodes: dict[str, NodeRun]
    drills: Drills
    began: float | None
    released: bool
    _released_t: float | None
    run_step: int | None
    restarts: dict[str, int]
    down: set[str]
    reviving: set[str]
    injecting: dict[str, int]
    held_exits: dict[str, Exited]
    rebooted: set[str]
    gang: set[str]
    gang_restarts: int

    @property
    def finished(self) -> bool:
        raise NotImplementedError

    def _exited(self, event: Exited) -> list[Action]:
        raise NotImplementedError

    def _fail(self, problem: str) -> list[Action]:
        raise NotImplementedError

    def _maybe_done(self) -> list[Action]:
        raise NotImplementedError

    def _mark_started(self, name: str, t: float) -> None:
        raise NotImplementedError


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
        return drill + self._fail(f"no worker made progress in {self.plan.stall_s:g}s after the drill's "
                                  f"{describe(stalled)}: the training did not recover from it"), True

    def _steps(self) -> dict[str, int | None]:
        return {name: (self.nodes[name].steps[-1][1] if self.nodes[name].steps else None)
                for name in self.plan.finishers}

    def _due(self, t: float) -> list[Action]:
        if self.finished or not self.drills:
            return []
        released = self.began if not self.plan.servers else self._released_t
        due = self.drills.due(t, released if self.released else None, self.run_step)
        for index in due:
            fault = self.drills.states[index].fault
            if fault.action in ENDS_PROCESS:
                self.injecting[fault.node] = index
        return [Inject(i) for i in due]

    def _injected(self, event: Injected) -> list[Action]:
        state = self.drills.states[event.index]
        self.drills.hit(event.index, event.t, self.run_step, self._steps(), event.done, event.error)
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
                self.rebooted.add(fault.node)
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
        node.verdict = {"kill": "killed", "stop": "shut down", "restart": "rebooted"}.get(
            fault.action if fault else "kill", "killed")
        node.reason = f"by the drill ({fault.describe()})" if fault else "by the drill"
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
            self.nodes[name].verdict = "restarting"
        actions: list[Action] = [Say(f"{why}; restarting every worker together (an all-reduce job trains in "
                                     f"lockstep), restart {self.gang_restarts} of {self.plan.restarts}")]
        for name in sorted(self.down - self.reviving):
            self.reviving.add(name)
            actions.append(Revive(name))
        if still:
            actions.append(Stop(still))
        return actions + self._gang_ready(None)

    def _gang_member_ended(self, node: NodeRun, event: Exited) -> list[Action]:
        node.verdict = "restarting"
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
