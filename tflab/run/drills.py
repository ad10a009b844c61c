"""A run's drills: which faults are due, which were done, what followed, and the run's verdict against what the
drill expected. Pure bookkeeping for the run's machine.

A fault is due `at step N` when a worker first reports step N or later, or `at Ns` after the
workers were released; one that lasts (`for Ss`) is healed S seconds after it hit. While a
drill is on, and for a while after (`stall_s`), a run that makes no progress at all is ended
with the drill named: a drill never leaves a run hanging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tflab.plan.faults import ENDS_PROCESS, Fault
from tflab.run.events import Finish
from tflab.run.words import Verdict


@dataclass
class DrillState:
    """One fault of a run, as it happened."""

    fault: Fault
    hit_t: float | None = None  # when the injector began to do it
    hit_step: int | None = None  # the furthest step a worker had reported then
    applied_t: float | None = None  # when the injector was done (a reboot: its machine up again)
    due_step: int | None = None  # what the run had reached when it fell due, and each worker's step
    due_steps: dict[str, int | None] = field(default_factory=dict)
    done: str | None = None  # what was done, in words
    error: str | None = None
    healed_t: float | None = None
    healed: str | None = None
    back_t: float | None = None  # its node came back (then restart, a restart, or --restarts)
    # node -> [its step when it hit, its step when it ended]; None: it had reported no step yet (a worker still
    # starting when the run reached the fault's step is in it too: what it did while the fault was on is news)
    during: dict[str, list[int | None]] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.hit_t is not None and self.healed_t is None and self.fault.for_s is not None


class Drills:
    """The faults of one run and their course."""

    def __init__(self, faults: Sequence[Fault], stall_s: float = 60.0) -> None:
        self.states = [DrillState(f) for f in faults]
        self.stall_s = stall_s
        self.injected: set[int] = set()

    def __bool__(self) -> bool:
        return bool(self.states)

    def due(self, t: float, released_t: float | None, step: int | None,
            steps: Mapping[str, int | None] | None = None) -> list[int]:
        """Faults to do now: their step reached, or their time come (each once); the run's step and each worker's
        (`steps`) are kept as the fault's: the injector begins at once, and the steps go on while it works."""
        found = []
        for index, state in enumerate(self.states):
            if index in self.injected or released_t is None:
                continue
            fault = state.fault
            if (fault.at_step is not None and step is not None and step >= fault.at_step) or \
                    (fault.at_s is not None and t - released_t >= fault.at_s):
                self.injected.add(index)
                state.due_step, state.due_steps = step, dict(steps or {})
                found.append(index)
        return found

    def heal_due(self, t: float) -> list[int]:
        """Lasting faults whose time is up."""
        return [i for i, s in enumerate(self.states)
                if s.active and t >= (s.hit_t or t) + (s.fault.for_s or 0.0)]

    def hit(self, index: int, began: float, applied: float, done: str | None, error: str | None) -> None:
        """The injector did fault `index` (or could not), from `began` to `applied`: it hit when it began, at the
        steps of when it fell due (a kill under load took effect by step 75, its docker exec returned at 550)."""
        state = self.states[index]
        state.hit_t, state.applied_t, state.done, state.error = began, applied, done, error
        state.hit_step = state.due_step
        state.during = {node: [value, value] for node, value in state.due_steps.items()}

    def heal(self, index: int, t: float, what: str | None, steps: Mapping[str, int | None]) -> None:
        state = self.states[index]
        state.healed_t, state.healed = t, what
        self.note_steps(steps, only=index)

    def note_steps(self, steps: Mapping[str, int | None], only: int | None = None) -> None:
        """Each active (or just healed) fault's `during`: the steps nodes reached while it was on."""
        for index, state in enumerate(self.states):
            if only is not None and index != only:
                continue
            if state.hit_t is None or (state.healed_t is not None and only is None):
                continue
            for node, value in steps.items():
                if value is not None and node in state.during:
                    state.during[node][1] = value

    def downed(self, node: str) -> DrillState | None:
        """The fault that ended `node`'s processes (kill, stop, restart), if one hit it and it is not back."""
        for state in self.states:
            if state.fault.node == node and state.fault.action in ENDS_PROCESS and state.hit_t is not None \
                    and state.error is None and state.back_t is None:
                return state
        return None

    def last_on(self, node: str) -> DrillState | None:
        """The last fault that ended `node`'s processes, back or not."""
        hit = [s for s in self.states if s.fault.node == node and s.fault.action in ENDS_PROCESS
               and s.hit_t is not None and s.error is None]
        return max(hit, key=lambda s: s.hit_t or 0.0) if hit else None

    def back(self, node: str, t: float) -> None:
        for state in self.states:
            if state.fault.node == node and state.hit_t is not None and state.back_t is None:
                state.back_t = t

    def last_event(self) -> float | None:
        """When a drill last did something (hit, or healed)."""
        times = [t for s in self.states for t in (s.hit_t, s.applied_t) if t is not None]
        times += [s.healed_t for s in self.states if s.healed_t is not None]
        return max(times) if times else None

    def stalled(self, t: float, last_progress: float | None) -> DrillState | None:
        """The drill to name when nothing has progressed for `stall_s` since it (or since the last progress)."""
        last = self.last_event()
        if last is None:
            return None
        since = max(last, last_progress or last)
        if t - since <= self.stall_s:
            return None
        return max((s for s in self.states if s.hit_t is not None), key=lambda s: s.healed_t or s.hit_t or 0.0)

    def missed(self) -> list[DrillState]:
        return [s for s in self.states if s.hit_t is None]

    def names(self) -> str:
        """The drill in words: `kill worker1 at step 52 (planned at step 50)`."""
        return "; ".join(describe(s) for s in self.states)

    def judge(self, finish: Finish, expect: str | None) -> Finish:
        """The verdict of a drilled run: what the training did (`finish`), against what the drill expected."""
        if not self.states or finish.verdict == Verdict.INTERRUPTED:
            return finish
        drill = self.names()
        if expect and self.missed():
            return Finish(1, Verdict.MISSED, f"the drill did not happen: {drill} (the training ended first)")
        survived = finish.verdict == Verdict.OK
        if expect == "fail":
            if survived:
                return Finish(1, Verdict.SURVIVED, f"the training finished despite the drill ({drill}); it was "
                                             "expected to fail")
            return Finish(0, Verdict.OK, f"as expected, the drill broke the training: {finish.problem} ({drill})")
        if survived:
            return Finish(0, Verdict.OK, None)
        return Finish(finish.exit_code, finish.verdict, f"{finish.problem} (the drill: {drill})")

    def rows(self, began: float | None) -> list[dict[str, Any]]:
        """The drill as run.json keeps it."""
        def since(t: float | None) -> float | None:
            return None if t is None or began is None else round(t - began, 2)

        return [{"fault": s.fault.text, "what": s.fault.describe(), "planned": s.fault.when,
                 "hit_s": since(s.hit_t), "hit_step": s.hit_step, "done": s.done, "error": s.error,
                 "healed_s": since(s.healed_t), "healed": s.healed, "back_s": since(s.back_t),
                 "during": s.during} for s in self.states]


def describe(state: DrillState) -> str:
    """What a fault did and when, in words."""
    fault = state.fault
    if state.hit_t is None:
        return f"{fault.describe()} (planned at {fault.when}) never hit"
    at = f"step {state.hit_step}" if state.hit_step is not None else "its time"
    return f"{fault.describe()} at {at} (planned at {fault.when})"
