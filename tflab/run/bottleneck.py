"""What limited a run, from measured figures: pure, figures in, a named limit and its evidence out.

A node busy at its own CPU share is the design under study (a parameter server too small, a
straggler), not the host's fault; the host is blamed only when its CPUs were saturated while the
nodes' shares oversubscribe it or are unset (then the steps/s are this host's, not a cluster's:
the fidelity warning of network emulators such as Mininet-HiFi). The kinds:

- `memory`: a node's memory reached its limit;
- `host`: the host's CPUs saturated, the nodes' shares oversubscribing it (or unset), or work outside
  the lab taking a share of them (the host busier than the nodes' own use says: its CPU time less
  theirs); where no node has a share, also tasks waiting for a CPU while the host's CPUs look idle
  (the kernel's CPU pressure: a quota or cpuset above tflab gives the lab fewer CPUs than the host has);
- `link`: a node's traffic near its link's rate;
- `ps-cpu`: a parameter server busy at its CPU share, the workers less so;
- `worker-cpu`: workers at their share (one alone at it: the straggler);
- `none`: no node at a limit, and the host had room.

Only the training's span counts (from the first step on): start-up imports are not the design.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SATURATED = 0.90  # the host's CPUs this busy...
WAITING = 0.50  # ...or, where no node has a CPU quota of its own, some task waiting for a CPU this share of the time...
MOST = 0.50  # ...for more than this share of the training
AT_SHARE = 0.85  # a node using this much of the CPUs it owns, on average, is at its share...
THROTTLED = 0.30  # ...as is one its quota held back in this share of its scheduling periods
BELOW = 0.15  # ...and the others at least this much less busy: it, not they, set the pace
STRAGGLER_GAP = 0.25  # one worker at its share, the others this much below: the straggler
NEAR_LINK = 0.80  # traffic this close to a link's rate (busiest quarter of the samples)
NEAR_LIMIT = 0.90  # memory this close to a node's limit, at its peak
MIN_SAMPLES = 3
OUTSIDE = 0.25  # work outside the lab taking this share of the host's CPUs, while they are saturated: the host's

KINDS = ("memory", "host", "link", "ps-cpu", "worker-cpu", "none")


@dataclass(frozen=True)
class Limit:
    """What limited a run, and the measured figures that say so."""

    kind: str
    evidence: str

    def sentence(self) -> str:
        """The run summary's line."""
        if self.kind == "none":
            return f"what limited this run: no limit found ({self.evidence})"
        return f"what limited this run: {self.kind}: {self.evidence}"

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "evidence": self.evidence}


@dataclass
class Series:
    """A run's figures over its training: the host's CPU, and each node's CPU share, memory and traffic."""

    host_busy: list[float] = field(default_factory=list)
    host_waiting: list[float | None] = field(default_factory=list)  # beside each host_busy: some task waiting
    cpu_share: dict[str, list[float]] = field(default_factory=dict)
    memory_share: dict[str, list[float]] = field(default_factory=dict)
    memory_limit_mb: dict[str, float] = field(default_factory=dict)
    rx_mbit: dict[str, list[float]] = field(default_factory=dict)
    tx_mbit: dict[str, list[float]] = field(default_factory=dict)
    owned: dict[str, float] = field(default_factory=dict)  # the CPUs each node owned, as its cgroup said last
    throttled: dict[str, list[float]] = field(default_factory=dict)  # share of its quota periods held back

    def add(self, host_busy: float | None, nodes: Sequence[Any], host_waiting: float | None = None) -> None:
        """One snapshot: the host's busy share, each node's figures (engine.metrics.NodeFigures), and the share
        of the interval in which some task waited for a CPU (None where the kernel does not say)."""
        if host_busy is not None:
            self.host_busy.append(host_busy)
            self.host_waiting.append(host_waiting)
        for figures in nodes:
            if figures.cpu_share is not None:
                self.cpu_share.setdefault(figures.node, []).append(figures.cpu_share)
                self.owned[figures.node] = figures.cpu_owned
            if figures.throttled is not None:
                self.throttled.setdefault(figures.node, []).append(figures.throttled)
            if figures.memory_share is not None:
                self.memory_share.setdefault(figures.node, []).append(figures.memory_share)
                self.memory_limit_mb[figures.node] = figures.memory_limit_mb
            if figures.rx_mbit is not None:
                self.rx_mbit.setdefault(figures.node, []).append(figures.rx_mbit)
            if figures.tx_mbit is not None:
                self.tx_mbit.setdefault(figures.node, []).append(figures.tx_mbit)


    def means(self) -> dict[str, dict[str, float | None]]:
        """Each node's mean CPU (a share of what it owns), and Mbit/s sent and received, over the training."""
        nodes = set(self.cpu_share) | set(self.tx_mbit) | set(self.rx_mbit)

        def mean(values: Sequence[float] | None, digits: int) -> float | None:
            return round(_mean(values), digits) if values else None

        return {node: {"cpu": mean(self.cpu_share.get(node), 3), "tx_mbit": mean(self.tx_mbit.get(node), 2),
                       "rx_mbit": mean(self.rx_mbit.get(node), 2)} for node in sorted(nodes)}


@dataclass(frozen=True)
class Shape:
    """What the lab's design says of its nodes: who serves, who trains, the CPUs each owns, its link."""

    servers: tuple[str, ...]
    workers: tuple[str, ...]
    cpus: Mapping[str, float | None]  # None: it shares the host's CPUs
    host_cpus: int
    link_mbit: float | None = None  # every node's link rate, where links are shaped


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _busiest_quarter(values: Sequence[float]) -> float:
    top = sorted(values)[-max(1, len(values) // 4):]
    return _mean(top)


def _cpus(value: float | None) -> str:
    return f"{value:g} CPU" if value is not None else "the host's CPUs"


def _memory(mb: float | None) -> str:
    if not mb:
        return ""
    return f" of its {mb / 1024:.1f}G limit" if mb >= 1024 else f" of its {mb:.0f}M limit"


def find(series: Series, shape: Shape) -> Limit:
    """The limit the figures show (the first of KINDS that they show)."""
    for node, values in sorted(series.memory_share.items()):
        if values and max(values) >= NEAR_LIMIT:
            return Limit("memory", f"{node}'s memory reached {max(values):.0%}"
                                   f"{_memory(series.memory_limit_mb.get(node))}")
    host = _host(series, shape)
    if host is not None:
        return host
    link = _link(series, shape)
    if link is not None:
        return link
    busy = {n: _mean(v) for n, v in series.cpu_share.items()
            if len(v) >= MIN_SAMPLES and shape.cpus.get(n) is not None}
    # what each owned during the run (a `tflab fault cpu` changes it), else what the design gave it
    owned = {n: series.owned.get(n) or shape.cpus.get(n) for n in shape.cpus}
    held = {n: _mean(v) for n, v in series.throttled.items() if len(v) >= MIN_SAMPLES}
    cpu = _cpu(busy, shape, owned, held)
    if cpu is not None:
        return cpu
    return _crowded(series, shape) or _nothing(series, shape, owned)


def _crowded(series: Series, shape: Shape) -> Limit | None:
    """No node at its share while the host's CPUs were saturated, much of them by work outside the lab's nodes."""
    if len(series.host_busy) < MIN_SAMPLES or _saturated(series) <= MOST:
        return None
    outside = _outside(series, shape)
    if outside < OUTSIDE * shape.host_cpus:
        return None
    return Limit("host", f"the host's {shape.host_cpus} CPUs were at least {SATURATED:.0%} busy in "
                         f"{_saturated(series):.0%} of the training, and work outside the lab's nodes took about "
                         f"{outside:.1f} of them ({outside / shape.host_cpus:.0%}; the nodes used "
                         f"{_lab_cpus(series, shape):.1f}): no node could use its share, and its steps/s are this "
                         "host's, not a cluster's of this shape")


def _nothing(series: Series, shape: Shape, owned: Mapping[str, float | None]) -> Limit:
    """No limit: the busiest node, and where nodes share the host's CPUs, how busy the host was."""
    seen = {n: _mean(v) for n, v in series.cpu_share.items() if len(v) >= MIN_SAMPLES}
    if not seen:
        count = len(series.host_busy)
        return Limit("none", f"too few figures of the training to tell ({count} snapshot{'' if count == 1 else 's'} "
                             "from its first step to its end)")
    top = max(seen, key=lambda n: seen[n])
    mine = "the host's CPUs" if shape.cpus.get(top) is None and owned.get(top) in (None, float(shape.host_cpus)) \
        else f"its {_cpus(owned.get(top))}"
    room = ""
    if _unset(shape) and len(series.host_busy) >= MIN_SAMPLES:
        room = (f"; the host's {shape.host_cpus} CPUs had room (at least {SATURATED:.0%} busy in "
                f"{_saturated(series):.0%} of the training)")
    return Limit("none", f"the busiest node, {top}, used {seen[top]:.0%} of {mine}{room}; "
                         "no link or memory near its limit: the program's own waits set the pace")


def _unset(shape: Shape) -> list[str]:
    """The servers and workers with no CPU share of their own."""
    return [n for n in (*shape.servers, *shape.workers) if shape.cpus.get(n) is None]


def _saturated(series: Series) -> float:
    """The share of the training's snapshots in which the host's CPUs were saturated."""
    return sum(b >= SATURATED for b in series.host_busy) / len(series.host_busy)


def _pressed(series: Series) -> float:
    """The share of the training's snapshots in which the host's CPUs were saturated or some task waited for
    one: where no node has a quota of its own, a wait is the host's (a quota or cpuset above the lab)."""
    return sum(b >= SATURATED or (w is not None and w >= WAITING)
               for b, w in zip(series.host_busy, series.host_waiting)) / len(series.host_busy)


def _host(series: Series, shape: Shape) -> Limit | None:
    if len(series.host_busy) < MIN_SAMPLES:
        return None
    saturated = _saturated(series)
    # A node's own quota makes its tasks wait too: the wait tells of the host only where no node has one, by
    # design or by a `fault cpu` during the run (then its quota held it back in some periods).
    quotaless = all(shape.cpus.get(n) is None for n in shape.cpus) and \
        not any(share > 0 for shares in series.throttled.values() for share in shares)
    pressed = _pressed(series) if quotaless else saturated
    if pressed <= MOST:  # at least `saturated`: a saturated snapshot is a pressed one
        return None
    unset = _unset(shape)
    owned = sum(c for c in shape.cpus.values() if c is not None)
    if unset:
        why = f"{', '.join(unset)} {'has' if len(unset) == 1 else 'have'} no CPU share of {'its' if len(unset) == 1 else 'their'} own"
    elif owned > shape.host_cpus + 1e-9:
        why = f"the nodes' shares add up to {owned:g} CPUs of its {shape.host_cpus}"
    else:
        return None  # the shares fit the host: a node busy at its share is the design's limit
    cpus = f"the host's {shape.host_cpus} CPUs"
    if saturated > MOST:
        seen = f"{cpus} were at least {SATURATED:.0%} busy in {saturated:.0%} of the training"
    else:
        seen = (f"some task waited for a CPU {WAITING:.0%} of the time or more (or the CPUs were saturated) in "
                f"{pressed:.0%} of the training, while {cpus} were {_mean(series.host_busy):.0%} busy on average: "
                "something above tflab (a CPU quota or cpuset) gives the lab fewer CPUs than the host has")
    return Limit("host", f"{seen}, and {why}: its steps/s are this host's, not a cluster's of this shape")


def _lab_cpus(series: Series, shape: Shape) -> float:
    """The CPUs the lab's nodes used on average over the training (each one's share times what it owned)."""
    return sum(_mean(values) * (series.owned.get(node) or shape.cpus.get(node) or float(shape.host_cpus))
               for node, values in series.cpu_share.items() if values)


def _outside(series: Series, shape: Shape) -> float:
    """The CPUs something outside the lab used on average: the host's busy CPUs less the lab's nodes' own use."""
    return max(0.0, _mean(series.host_busy) * shape.host_cpus - _lab_cpus(series, shape))


def _link(series: Series, shape: Shape) -> Limit | None:
    if not shape.link_mbit:
        return None
    found: list[tuple[float, str]] = []
    for way, table in (("received", series.rx_mbit), ("sent", series.tx_mbit)):
        for node, values in table.items():
            if len(values) >= MIN_SAMPLES:
                rate = _busiest_quarter(values)
                if rate >= NEAR_LINK * shape.link_mbit:
                    found.append((rate, f"{node} {way} {rate:.1f} Mbit/s on its {shape.link_mbit:g} Mbit/s link "
                                        f"({rate / shape.link_mbit:.0%}, its busiest quarter)"))
    return Limit("link", max(found)[1]) if found else None


def _held(node: str, held: Mapping[str, float]) -> str:
    share = held.get(node, 0.0)
    return f" (held back at its quota in {share:.0%} of its periods)" if share >= THROTTLED else ""


def _cpu(busy: Mapping[str, float], shape: Shape, owned: Mapping[str, float | None],
         held: Mapping[str, float]) -> Limit | None:
    servers = {n: busy[n] for n in shape.servers if n in busy}
    workers = {n: busy[n] for n in shape.workers if n in busy}
    at_share = {n for n, b in busy.items() if b >= AT_SHARE or held.get(n, 0.0) >= THROTTLED}
    if not at_share:
        return None
    worker_mean = _mean(list(workers.values())) if workers else 0.0
    top_server = max(servers, key=lambda n: servers[n]) if servers else None
    if top_server in at_share and servers[top_server] >= worker_mean + BELOW:
        theirs = f"; workers at {worker_mean:.0%} of theirs" if workers else ""
        return Limit("ps-cpu", f"{top_server} at {servers[top_server]:.0%} of its {_cpus(owned.get(top_server))}"
                               f"{_held(top_server, held)}{theirs}")
    loaded = sorted((n for n in workers if n in at_share), key=lambda n: -workers[n])
    if not loaded:
        return None
    others = [b for n, b in workers.items() if n not in loaded]
    if len(loaded) == 1 and others and _mean(others) <= workers[loaded[0]] - STRAGGLER_GAP:
        one = loaded[0]
        return Limit("worker-cpu", f"{one} at {workers[one]:.0%} of its {_cpus(owned.get(one))}{_held(one, held)}, "
                                   f"the other workers at {_mean(others):.0%} of theirs: {one} is the straggler")
    servers_text = f" ({', '.join(f'{n} at {b:.0%}' for n, b in servers.items())})" if servers else ""
    return Limit("worker-cpu", f"{', '.join(loaded)} at {_mean([workers[n] for n in loaded]):.0%} of their "
                               f"CPU shares{servers_text}")


__all__ = ["KINDS", "Limit", "Series", "Shape", "find"]
