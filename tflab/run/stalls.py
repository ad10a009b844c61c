"""When a run is stalled, and what its cluster then says of itself: who never joined, a proxy on the way. Pure.

A run stalls (StallRule, asked by run/machine) where finishers printed no step, and no node printed a
line of its own or computed, for --stall seconds, by the cluster's CPU figures covering that time. Then
each node of the run is asked, before anything stops, whether every other node's
TensorFlow port answers from it, and which proxy variables its processes see (engine/guardcmd.reach).
Read here as a cluster's expert reads it: a node whose port answers from nowhere never joined (its
program never started its server); a node whose programs send their peers' connections to a proxy
(gRPC honours grpc_proxy, https_proxy and http_proxy, and passes by the hosts no_proxy names) waits on
something that cannot reach them; a pair that cannot reach each other though the port answers elsewhere
has something between them; and where every port answers directly, no cause is guessed: where each waits is
its stack (run/waits), read beside this look.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tflab.plan.topology import GRPC_PORT
from tflab.run.events import Busy
from tflab.run.noderun import NodeRun

BUSY_CPU = 0.05  # CPUs' worth: a node that used more computed (an idle TensorFlow process and tflab's own use less)
FIGURES_STALE_S = 10.0  # CPU figures older than this do not say what the nodes do now


class StallRule:
    """The nodes' CPU as the cluster's figures tell it, and whether the run has been silent and idle for `stall_s`."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self.figures: tuple[float, float] | None = None  # the first and the last time figures were heard

    def heard(self, event: Busy, nodes: Mapping[str, NodeRun]) -> None:
        self.figures = (self.figures[0] if self.figures else event.t, event.t)
        for name, used in event.cpu:
            node = nodes.get(name)
            if node is not None and (used is None or used >= BUSY_CPU):  # a figure missing: it may have computed
                node.last_busy = event.t

    def waiting(self, t: float, released: float, nodes: Mapping[str, NodeRun], finishers: Sequence[str]) -> list[str]:
        """The running finishers that printed no step, where no running node printed, computed or progressed since
        `stall_s` ago (the figures covering that time, and the workers released before it); [] otherwise."""
        if not self.stall_s or self.figures is None:
            return []
        since = t - self.stall_s
        first, last = self.figures
        if released > since or first > since or t - last > FIGURES_STALE_S:
            return []  # not that long yet, or the CPU figures do not cover it
        running = [node for node in nodes.values() if node.running]
        if any(when is not None and when > since
               for node in running for when in (node.last_said, node.last_busy, node.last_progress)):
            return []
        return [name for name in finishers if nodes[name].running and not nodes[name].progressed]

# What gRPC reads (lower case only), in its order: the proxy, and the hosts it passes by.
GRPC_PROXIES = ("grpc_proxy", "https_proxy", "http_proxy")
GRPC_NO_PROXY = ("no_grpc_proxy", "no_proxy")
REACHED = 0  # the probe's answer when the port accepted


@dataclass(frozen=True)
class Look:
    """What one node said: whether each peer's port answered from it, the proxy variables its programs see."""

    node: str
    answers: dict[str, bool] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def read_look(node: str, output: str, program_env: Mapping[str, str] | None = None) -> Look:
    """A node's answer (`reach PEER CODE` and `env NAME=VALUE` lines), with what the run's programs get on top of the
    node's environment (`program_env`: a run's --env, for instance)."""
    answers: dict[str, bool] = {}
    env: dict[str, str] = {}
    for line in output.splitlines():
        word, _, rest = line.partition(" ")
        if word == "reach":
            peer, _, code = rest.rpartition(" ")
            answers[peer] = code.strip() == str(REACHED)
        elif word == "env":
            name, _, value = rest.partition("=")
            env[name] = value
    for name, value in (program_env or {}).items():
        if name.lower() in GRPC_PROXIES + GRPC_NO_PROXY:
            env[name] = value
    return Look(node, answers, env)


def proxy_for(env: Mapping[str, str], host: str) -> tuple[str, str] | None:
    """(the variable, the proxy) gRPC sends a connection to `host` through under `env`; None where it goes directly."""
    chosen = next(((name, env[name]) for name in GRPC_PROXIES if env.get(name)), None)
    if chosen is None:
        return None
    bypass = next((env[name] for name in GRPC_NO_PROXY if env.get(name) is not None), "")
    for entry in (item.strip().lower() for item in bypass.split(",")):
        if entry == "*" or (entry and host.lower().endswith(entry.lstrip("*"))):
            return None
    return chosen


@dataclass(frozen=True)
class Findings:
    """What the look found: sentences to say, and the record run.json keeps (`stall`)."""

    said: list[str]
    record: dict[str, Any]
    diagnosis: dict[str, str]  # id, cause, cure: for the stalled nodes, where their output names nothing known


def findings(stalled: Sequence[str], looks: Mapping[str, Look]) -> Findings:
    """Who never joined, who cannot reach whom and why, from every node's look."""
    nodes = list(looks)
    never_joined = [peer for peer in nodes if not any(look.answers.get(peer) for look in looks.values())
                    and any(peer in look.answers for look in looks.values())]
    joined = [peer for peer in nodes if peer not in never_joined]
    proxied: dict[str, dict[str, tuple[str, str]]] = {}
    for look in looks.values():
        for peer in look.answers:
            through = proxy_for(look.env, peer)
            if through is not None:
                proxied.setdefault(look.node, {})[peer] = through
    cut = [(look.node, peer) for look in looks.values() for peer, answered in look.answers.items()
           if not answered and peer in joined]
    said: list[str] = []
    if never_joined and not joined:
        said.append(f"no node's TensorFlow port answers ({', '.join(f'{n}:{GRPC_PORT}' for n in nodes)}): none of "
                    "the programs started its server, or they listen elsewhere than TF_CONFIG says")
    else:
        for peer in never_joined:
            said.append(f"{peer} never joined: no node reaches {peer}:{GRPC_PORT} (its program has not started its "
                        "TensorFlow server: look at what it does before that)")
    for node, peers in proxied.items():
        names = sorted(peers)
        variable, proxy = peers[names[0]]
        said.append(f"{node}'s programs send their connections to {', '.join(names)} through the proxy {proxy} (its "
                    f"{variable}), which cannot reach the lab's nodes: its no_proxy does not name them")
    for node, peer in cut:
        where = [look.node for look in looks.values() if look.answers.get(peer)]
        said.append(f"{node} cannot reach {peer}:{GRPC_PORT}, which answers from {', '.join(where)}: something between "
                    "them drops it (a `tflab fault cut`? a firewall)")
    waits = []
    for node in stalled:
        if node not in looks:
            continue
        blocked = sorted({*never_joined, *proxied.get(node, {}), *(p for n, p in cut if n == node)} - {node})
        if node in never_joined:
            waits.append(f"{node} has not started its TensorFlow server")
        else:
            waits.append(f"{node} waits for {', '.join(blocked)}" if blocked else
                         f"{node} waits, though every peer's port answers from it")
    if not said:
        said.append("every node reaches every other node's TensorFlow port directly: no node stands in another's way "
                    "(where each waits: its stack)")
    record = {"stalled": list(stalled), "never_joined": never_joined, "unreachable": [list(pair) for pair in cut],
              "proxied": {node: {peer: proxy for peer, (_, proxy) in peers.items()} for node, peers in proxied.items()},
              "waits": waits, "said": said}
    return Findings(said=said + waits, record=record, diagnosis=_diagnosis(never_joined, joined, proxied, cut))


def _diagnosis(never_joined: list[str], joined: list[str], proxied: Mapping[str, Mapping[str, tuple[str, str]]],
               cut: list[tuple[str, str]]) -> dict[str, str]:
    if proxied:
        return {"id": "stall-proxy",
                "cause": "the nodes' programs send their connections to each other through a proxy (gRPC honours "
                         "http_proxy), which cannot reach the lab's nodes",
                "cure": "name the lab's nodes in NO_PROXY and no_proxy (tflab does, where the Docker client puts "
                        "proxies into the nodes: a run's --env, or the program, must not take them out)"}
    if never_joined:
        return {"id": "stall-never-joined",
                "cause": (f"{', '.join(never_joined)} never started its TensorFlow server: the others wait for it"
                          if joined else "no node started its TensorFlow server"),
                "cure": "its stack shows what it does instead of making its strategy or server (the `where:` lines; "
                        "the whole dump in run.json and runs/TASK/logs/NODE.log)"}
    if cut:
        return {"id": "stall-unreachable",
                "cause": "some node cannot reach another's TensorFlow port",
                "cure": "heal what cuts them (`tflab fault clear`, a firewall rule)"}
    return {"id": "stall-waiting",
            "cause": "every node reaches every other node's TensorFlow port; the stalled nodes wait (where: the lines "
                     "above, each one's stack in run.json and its log)",
            "cure": ""}
