"""Faults on purpose, as data: what a drill does to which node, and when. Pure.

    kill NODE | stop NODE | restart NODE            the machine fails (SIGKILL), is shut down, is rebooted
    pause NODE                                      frozen (the engine's pause: the cgroup freezer)
    slow NODE RATE                                  its link at RATE, both ways (tc)
    cpu NODE SHARE                                  its CPU quota at SHARE CPUs
    cut NODE [from NODE,NODE]                       its traffic with the others dropped (iptables)

In a run (`tflab run TASK --fault "..."`) a fault says when: `at step N` (the first time a
worker reports step N or later) or `at Ns` (seconds after the workers started), and may say
`for Ss` (healed after S seconds; pause, slow, cpu, cut) and `then restart` (kill, stop:
the node comes back, and its process with it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tflab.errors import UserError
from tflab.plan import links

ACTIONS = ("kill", "stop", "restart", "pause", "slow", "cpu", "cut")
TIMED = ("pause", "slow", "cpu", "cut")  # may last `for` a while, then are healed
ENDS_PROCESS = ("kill", "stop", "restart")  # the node's processes end with it
NEEDS_NET_ADMIN = ("slow", "cut")
EXPECTATIONS = ("survive", "fail")
GRAMMAR = ('ACTION NODE [RATE|SHARE] [from NODE,NODE] at (step N|Ns) [for Ss] [then restart], e.g. '
           '"kill worker1 at step 300 then restart" or "pause worker2 at 30s for 15s"')


@dataclass(frozen=True)
class Fault:
    """One fault: what, on which node, with what, when, for how long, and whether the node comes back."""

    action: str
    node: str
    rate: str | None = None  # slow
    share: float | None = None  # cpu
    peers: tuple[str, ...] = ()  # cut: only from these (empty: from every other node)
    at_step: int | None = None
    at_s: float | None = None
    for_s: float | None = None
    then_restart: bool = False
    text: str = ""

    @property
    def when(self) -> str:
        """When it hits, as the user wrote it."""
        if self.at_step is not None:
            return f"step {self.at_step}"
        if self.at_s is not None:
            return f"{self.at_s:g}s"
        return "now"

    def describe(self) -> str:
        """What it does, in words: `kill worker1`, `slow ps0 to 10mbit`, `cut ps0 from worker0`."""
        what = f"{self.action} {self.node}"
        if self.action == "slow":
            what += f" to {self.rate}"
        elif self.action == "cpu":
            what += f" to {self.share:g} CPU"
        elif self.action == "cut" and self.peers:
            what += f" from {','.join(self.peers)}"
        return what


MIN_SHARE = 0.01  # the smallest CPU quota the engine sets


def _seconds(text: str, spec: str) -> float:
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)s?", text)
    if not match:
        raise UserError(f"fault {spec!r}: {text!r} is not a number of seconds (write 30s)")
    return float(match.group(1))


def parse(spec: str, nodes: Sequence[str], timed: bool = True) -> Fault:
    """A fault as written on the command line; `timed`: it must say when (`at ...`), as a drill's do."""
    words = spec.split()
    if len(words) < 2 or words[0] not in ACTIONS:
        raise UserError(f"fault {spec!r}: write {GRAMMAR}; the actions are {', '.join(ACTIONS)}")
    action, node, rest = words[0], words[1], words[2:]
    if node not in nodes:
        raise UserError(f"fault {spec!r}: no node {node!r} in this lab; its nodes are {', '.join(nodes)}")
    values: dict = {"action": action, "node": node, "text": spec}
    if action == "slow":
        if not rest:
            raise UserError(f"fault {spec!r}: slow needs a rate, e.g. slow {node} 10mbit")
        values["rate"] = links.parse_rate(rest.pop(0), "slow")
    elif action == "cpu":
        try:
            values["share"] = float(rest.pop(0)) if rest else None
        except ValueError:
            values["share"] = None
        if values["share"] is None or not values["share"] > 0 or not math.isfinite(values["share"]):
            raise UserError(f"fault {spec!r}: cpu needs a share of CPUs, e.g. cpu {node} 0.25")
        if values["share"] < MIN_SHARE:
            raise UserError(f"fault {spec!r}: {values['share']:g} CPU is less than the engine sets; use at least "
                            f"{MIN_SHARE:g}")
    while rest:
        word = rest.pop(0)
        if word == "from" and action == "cut" and rest:
            peers = tuple(p for p in rest.pop(0).split(",") if p)
            unknown = [p for p in peers if p not in nodes or p == node]
            if unknown or not peers:
                raise UserError(f"fault {spec!r}: cut {node} from other nodes of the lab ({', '.join(nodes)}), "
                                f"not {','.join(unknown) or 'nothing'}")
            values["peers"] = peers
        elif word == "at" and rest:
            moment = rest.pop(0)
            if moment == "step":
                if not (rest and rest[0].isascii() and rest[0].isdigit()):
                    raise UserError(f"fault {spec!r}: `at step` needs a step number (a whole number, 0 or more), "
                                    f"not {(rest or ['nothing'])[0]!r}")
                values["at_step"] = int(rest.pop(0))
            else:
                values["at_s"] = _seconds(moment, spec)
        elif word == "for" and rest:
            if action not in TIMED:
                raise UserError(f"fault {spec!r}: `for` lasts a {', '.join(TIMED)} fault; a {action} is done once")
            values["for_s"] = _seconds(rest.pop(0), spec)
        elif word == "then" and rest[:1] == ["restart"] and action in ("kill", "stop"):
            rest.pop(0)
            values["then_restart"] = True
        else:
            raise UserError(f"fault {spec!r}: cannot read {word!r}; write {GRAMMAR}")
    fault = Fault(**values)
    if timed and fault.at_step is None and fault.at_s is None:
        raise UserError(f"fault {spec!r}: say when it hits: at step N, or at Ns")
    return fault


def check_expectation(expect: str | None, faults: Sequence[Fault]) -> str | None:
    """`--expect survive|fail` goes with drills only."""
    if expect is None:
        return None
    if expect not in EXPECTATIONS:
        raise UserError(f"--expect must be survive or fail, not {expect!r}")
    if not faults:
        raise UserError("--expect says what a drill should do to the training: add a --fault")
    return expect
