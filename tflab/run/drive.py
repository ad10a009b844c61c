"""The one supervision loop: a run's events fed to its state machine, time ticked, its actions carried out.

`tflab run` (the launcher), `tflab exec NODE TASK` (an exec session) and `tflab exec NODE -- CMD`
all drive their machine here, at one pace; what differs is what they do with an action, what
they do every so often (write run.json, say the steps/s) and when they stop waiting for a
process that will not end.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tflab.run.events import Action, Exited, Tick
from tflab.run.machine import RunMachine

TICK_S = 0.2  # the machine hears the time this often
RECORD_EVERY_S = 2.0  # a run's record (run.json, an exec's record) is written this often while it runs


@dataclass(frozen=True)
class Every:
    """Something done every `seconds` while the machine runs (given the time)."""

    seconds: float
    do: Callable[[float], None]


def drive(machine: RunMachine, events: queue.SimpleQueue, carry_out: Callable[[list[Action]], None],
          clock: Callable[[], float], every: Sequence[Every] = (),
          give_up: Callable[[float], str | None] | None = None) -> None:
    """Feed `events` to `machine` and carry out what it says until the run is decided and nothing it started runs.

    `give_up(now)` says why to stop waiting for processes that will not end (a frozen node, a drain
    past its deadline); those still running are then recorded as ended, with that reason.
    """
    last_tick = clock()
    done_at = [last_tick] * len(every)
    while not machine.finished or machine.running():
        try:
            event = events.get(timeout=TICK_S)
        except queue.Empty:
            event = None
        now = clock()
        if event is not None:
            carry_out(machine.handle(event))
        if event is None or now - last_tick >= TICK_S:
            last_tick = now
            carry_out(machine.handle(Tick(now)))
        for number, task in enumerate(every):
            if now - done_at[number] >= task.seconds:
                done_at[number] = now
                task.do(now)
        why = give_up(now) if give_up is not None else None
        if why is not None:
            for name in machine.running():
                machine.handle(Exited(name, None, clock(), why))
            return
