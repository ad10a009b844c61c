"""The words a run's state machine hears (events: a node started, printed, exited; time passed) and says (actions).

The launcher and an exec session turn what happens into events; the machine (run/machine.py)
answers each with actions they carry out. Plain frozen dataclasses, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from tflab.run.words import Verdict

# -- events --------------------------------------------------------------------------------



@dataclass(frozen=True)
class Began:
    t: float


@dataclass(frozen=True)
class Stacks:
    """Where a node's process waits: the stacks of its threads (py-spy's dump), or why none could be read."""

    node: str
    t: float
    dump: str | None
    problem: str | None = None


@dataclass(frozen=True)
class Serving:
    node: str
    t: float


@dataclass(frozen=True)
class NotServing:
    """A server did not serve: the wait for it ended with `problem` (stuck, or its node could not be asked)."""

    node: str
    t: float
    problem: str


@dataclass(frozen=True)
class Printed:
    node: str
    t: float
    step: int | None = None  # the program's own step
    rate: float | None = None  # steps/s the line reported itself
    global_step: int | None = None  # the cluster's step (a between-graph trainer's global step), where it says it
    global_rate: float | None = None  # the cluster's steps/s the line reported (TF1's global_step/sec)
    leader_gone: bool = False  # the line says the coordination service's leader (the chief) is gone
    quality: tuple[tuple[str, float], ...] = ()  # the metrics it printed (plan/quality): accuracy, loss, ...
    runtime: bool = False  # an error TensorFlow's runtime logged (gRPC's retries...), not the program's own words


@dataclass(frozen=True)
class Exited:
    node: str
    code: int | None
    t: float
    reason: str | None = None  # why the code is unknown, or what happened to the node
    signal: str | None = None  # the signal that ended it, by name (SIGTERM), as its owner in the node saw it
    ended_by: str | None = None  # the node's word for how it ended (tflab_guard.protocol: exited, stopped, ...)


@dataclass(frozen=True)
class Busy:
    """How much CPU each node of the run used over the last second or two (CPUs' worth), as its cgroup counted it
    (the cluster's figures); None where its figure is missing."""

    t: float
    cpu: tuple[tuple[str, float | None], ...]


@dataclass(frozen=True)
class PeerEnded:
    """A node of the task outside this machine ended (the chief's own `tflab exec`, in another terminal)."""

    node: str
    code: int | None
    t: float


@dataclass(frozen=True)
class Tick:
    t: float


@dataclass(frozen=True)
class Interrupt:
    t: float
    reason: str = "interrupted"
    force: bool = False


@dataclass(frozen=True)
class Injected:
    """A fault of the drill was done (or could not be): at `t` the injector was done; it began at `began` (a
    kill takes effect in between, and a reboot's machine is up again by `t`)."""

    index: int
    t: float
    done: str | None = None
    error: str | None = None
    began: float | None = None


@dataclass(frozen=True)
class Healed:
    index: int
    t: float
    done: str | None = None


@dataclass(frozen=True)
class Revived:
    """A node's machine is running again (and answers)."""

    node: str
    t: float
    error: str | None = None


Event = (Began | Serving | NotServing | Printed | Exited | PeerEnded | Busy | Tick | Interrupt | Injected | Healed
         | Revived | Stacks)

# -- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    nodes: tuple[str, ...]
    held: bool = False
    attempt: int = 1


@dataclass(frozen=True)
class Release:
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    nodes: tuple[str, ...]
    force: bool = False


@dataclass(frozen=True)
class Say:
    message: str


@dataclass(frozen=True)
class Inject:
    """Do fault `index` of the drill."""

    index: int


@dataclass(frozen=True)
class Heal:
    index: int


@dataclass(frozen=True)
class Revive:
    """Bring a node's machine back (after a kill or a stop)."""

    node: str


@dataclass(frozen=True)
class Check:
    """Ask every node of a stalled run whether it reaches every other node's TensorFlow port (before they stop)."""

    nodes: tuple[str, ...]
    stalled: tuple[str, ...]


@dataclass(frozen=True)
class Inspect:
    """Read where each of these nodes' processes waits (their stacks), before what is said of them is decided."""

    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Finish:
    exit_code: int
    verdict: Verdict
    problem: str | None = None


Action = Start | Release | Stop | Say | Check | Inspect | Finish | Inject | Heal | Revive
