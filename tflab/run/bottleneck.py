"""Was the host, not the lab's design, the bottleneck of a run? Pure: figures in, sentences out.

The fidelity warning network emulators made famous (Mininet-HiFi): a run whose host's CPUs were
saturated most of the time, or a node held back at its CPU quota, or memory close to a limit,
shows this host's limits, and its steps/s are not those of a cluster of this shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

SATURATED = 0.90  # the host's CPUs this busy...
MOST = 0.50  # ...for more than this share of the run
THROTTLED = 0.30  # a node held back in this share of its scheduling periods, on average
NEAR_LIMIT = 0.90  # memory this close to a node's limit, at its peak


@dataclass
class Series:
    """A run's figures over time: the host's CPU, and each node's throttling and memory share."""

    host_busy: list[float] = field(default_factory=list)
    throttled: dict[str, list[float]] = field(default_factory=dict)
    memory_share: dict[str, list[float]] = field(default_factory=dict)
    owned_cpus: dict[str, float] = field(default_factory=dict)
    memory_limit_mb: dict[str, float] = field(default_factory=dict)

    def add(self, host_busy: float | None, nodes: Sequence) -> None:
        """One snapshot: the host's busy share and each node's figures (engine.metrics.NodeFigures)."""
        if host_busy is not None:
            self.host_busy.append(host_busy)
        for figures in nodes:
            if figures.throttled is not None:
                self.throttled.setdefault(figures.node, []).append(figures.throttled)
            if figures.memory_share is not None:
                self.memory_share.setdefault(figures.node, []).append(figures.memory_share)
                self.memory_limit_mb[figures.node] = figures.memory_limit_mb
            if figures.cpu_owned is not None:
                self.owned_cpus[figures.node] = figures.cpu_owned


def limits_reached(series: Series, host_cpus: int) -> list[str]:
    """The ways this run met the host's limits, as sentences (none: nothing to warn of)."""
    found = []
    if len(series.host_busy) >= 3:
        saturated = sum(b >= SATURATED for b in series.host_busy) / len(series.host_busy)
        if saturated > MOST:
            found.append(f"the host's {host_cpus} CPU{'s' if host_cpus != 1 else ''} were saturated "
                         f"(>= {SATURATED:.0%} busy) for {saturated:.0%} of the run")
    for node, values in sorted(series.throttled.items()):
        if len(values) >= 3:
            share = sum(values) / len(values)
            if share > THROTTLED:
                owned = series.owned_cpus.get(node)
                quota = f" of {owned:g} CPU" if owned is not None else ""
                found.append(f"{node} was held back at its quota{quota} in {share:.0%} of its scheduling periods")
    for node, values in sorted(series.memory_share.items()):
        if values and max(values) >= NEAR_LIMIT:
            limit = series.memory_limit_mb.get(node)
            of = f" of its {limit / 1024:.1f}G limit" if limit and limit >= 1024 else f" of its {limit:.0f}M limit" if limit else ""
            found.append(f"{node}'s memory reached {max(values):.0%}{of}")
    return found


def note(found: Sequence[str]) -> str | None:
    """The run summary's one line when the host was the bottleneck, else None."""
    if not found:
        return None
    return ("the host, not the lab's design, set the pace of this run: " + "; ".join(found) +
            ". Its steps/s are this host's, not those of a cluster of this shape.")
