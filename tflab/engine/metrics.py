"""The cluster's own figures: what each node uses, read by one small process in it, turned into rates here.

Every node runs the guard's `metrics` (its cgroup's files and /proc/net/dev, a JSON line a
second, and nvidia-smi where it has GPUs); `ClusterSampler` keeps each node's last two samples
and makes them figures: CPU used of what it owns, throttling, memory of its limit, network
Mbit/s, each GPU's use. The host's own CPU is read here beside them: how busy (/proc/stat), and how
often a task waited for a CPU (/proc/pressure/cpu).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tflab_guard.protocol import Sample

from tflab.engine import guardcmd
from tflab.engine.executors import Attached, Executor
from tflab.errors import TflabError
from tflab.host import hardware
from tflab.host.fanout import background
from tflab.plan.progress import LineSplitter


@dataclass(frozen=True)
class GpuFigures:
    """One GPU as its node sees it."""

    index: int  # the host's index (the node sees it as 0..K-1)
    util: float  # percent busy
    memory_mb: float
    memory_total_mb: float


@dataclass(frozen=True)
class NodeFigures:
    """One node over the last interval."""

    node: str
    t: float  # wall time of the sample
    cpu_used: float | None = None  # CPUs' worth of time used
    cpu_owned: float | None = None  # the CPUs it owns (cpuset or quota); None: it shares the host's
    throttled: float | None = None  # share of its quota periods it was held back in
    memory_mb: float | None = None
    memory_limit_mb: float | None = None
    rx_mbit: float | None = None
    tx_mbit: float | None = None
    gpus: tuple[GpuFigures, ...] = ()
    oom_kills: int | None = None

    @property
    def cpu_share(self) -> float | None:
        """CPU used as a share of what it owns (of the host's CPUs when it owns none)."""
        if self.cpu_used is None or not self.cpu_owned:
            return None
        return self.cpu_used / self.cpu_owned

    @property
    def memory_share(self) -> float | None:
        if self.memory_mb is None or not self.memory_limit_mb:
            return None
        return self.memory_mb / self.memory_limit_mb

    def as_dict(self) -> dict[str, Any]:
        """For `top --json` and the records."""
        def r(value: float | None, digits: int = 3) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "node": self.node, "time": r(self.t, 3),
            "cpu": {"used": r(self.cpu_used), "owned": r(self.cpu_owned), "share": r(self.cpu_share),
                    "throttled": r(self.throttled)},
            "memory": {"used_mb": r(self.memory_mb, 1), "limit_mb": r(self.memory_limit_mb, 1),
                       "share": r(self.memory_share)},
            "net": {"rx_mbit": r(self.rx_mbit), "tx_mbit": r(self.tx_mbit)},
            "gpus": [{"index": g.index, "util": g.util, "memory_mb": g.memory_mb,
                      "memory_total_mb": g.memory_total_mb} for g in self.gpus],
            "oom_kills": self.oom_kills,
        }


def figures(node: str, before: Sample, now: Sample, host_cpus: int, gpu_indices: Sequence[int] = ()) -> NodeFigures:
    """A node's figures from two readings of its metrics process (pure)."""
    elapsed = float(now.t) - float(before.t)
    if elapsed <= 0:
        elapsed = 1e-9

    def delta(field: str) -> float | None:
        later, earlier = getattr(now, field), getattr(before, field)
        if later is None or earlier is None:
            return None
        return max(0.0, float(later) - float(earlier))

    cpu_ns, periods, throttled = delta("cpu_ns"), delta("periods"), delta("throttled")
    rx, tx = delta("rx"), delta("tx")
    owned: float | None = now.quota or None
    if owned is None and now.cpuset and now.cpuset < host_cpus:
        owned = float(now.cpuset)
    gpus = tuple(
        GpuFigures(gpu_indices[i] if i < len(gpu_indices) else int(idx), util, used, total)
        for i, (idx, util, used, total) in enumerate(now.gpus or ())
    )
    return NodeFigures(
        node=node, t=float(now.t),
        cpu_used=None if cpu_ns is None else cpu_ns / 1e9 / elapsed,
        cpu_owned=owned if owned is not None else (float(host_cpus) if host_cpus else None),
        throttled=(throttled / periods) if periods and throttled is not None else (0.0 if periods == 0 and owned else None),
        memory_mb=None if now.mem is None else now.mem / 2**20,
        memory_limit_mb=None if now.mem_limit is None else now.mem_limit / 2**20,
        rx_mbit=None if rx is None else rx * 8 / elapsed / 1e6,
        tx_mbit=None if tx is None else tx * 8 / elapsed / 1e6,
        gpus=gpus, oom_kills=now.oom,
    )


def host_busy(before: tuple[float, float], now: tuple[float, float]) -> float | None:
    """The share of the host's CPU time that was busy between two readings of (busy, total) jiffies."""
    total = now[1] - before[1]
    return None if total <= 0 else max(0.0, min(1.0, (now[0] - before[0]) / total))


@dataclass
class Snapshot:
    """Every node's latest figures and the host's CPU, at one moment."""

    t: float
    nodes: dict[str, NodeFigures] = field(default_factory=dict)
    host_busy: float | None = None
    host_waiting: float | None = None  # the share of the interval in which some task waited for a CPU


class ClusterSampler:
    """One metrics process per node, their samples turned into figures as they come."""

    def __init__(self, executor: Executor, nodes: Sequence[str], host_cpus: int,
                 gpu_indices: Mapping[str, Sequence[int]] | None = None, every_s: float = 1.0,
                 on_snapshot: Callable[[Snapshot], None] | None = None) -> None:
        self.executor = executor
        self.nodes = list(nodes)
        self.host_cpus = host_cpus
        self.gpu_indices = dict(gpu_indices or {})
        self.every_s = every_s
        self.on_snapshot = on_snapshot
        self.samples: dict[str, list[Sample]] = {n: [] for n in self.nodes}
        self.latest: dict[str, NodeFigures] = {}
        self.processes: dict[str, Attached] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.host: tuple[float, float] | None = None
        self.host_share: float | None = None
        self.pressure: tuple[float, float] | None = None  # (monotonic time, seconds some task waited so far)
        self.host_waiting: float | None = None

    def start(self) -> ClusterSampler:
        """Start each node's metrics (one `docker exec` after another); a close meanwhile ends what it started."""
        for node in self.nodes:
            splitter = LineSplitter()

            def on_output(chunk: bytes, is_err: bool, node: str = node, splitter: LineSplitter = splitter) -> None:
                if is_err:
                    return
                for line in splitter.feed(chunk):
                    self._sample(node, line)

            if self.stopped.is_set():
                break
            try:
                process = self.executor.start(node, guardcmd.metrics(self.every_s), on_output, lambda _end: None,
                                              workdir="/")
            except TflabError:
                continue  # a node that is gone has no figures
            with self.lock:
                self.processes[node] = process
            if self.stopped.is_set():
                process.close()  # closed while this one started: it ends too
        background(self._tick, name="cluster-tick")
        return self

    def _sample(self, node: str, line: str) -> None:
        sample = Sample.parse(line)
        if sample is None:
            return
        with self.lock:
            kept = self.samples[node]
            kept.append(sample)
            del kept[:-2]
            if len(kept) == 2:
                self.latest[node] = figures(node, kept[0], kept[1], self.host_cpus, self.gpu_indices.get(node, ()))

    def _tick(self) -> None:
        while not self.stopped.wait(self.every_s):
            times = hardware.cpu_times()
            if times is not None:
                if self.host is not None:
                    self.host_share = host_busy(self.host, times)
                self.host = times
            waited = hardware.cpu_pressure()
            if waited is not None:
                now = (time.monotonic(), waited)
                if self.pressure is not None and now[0] > self.pressure[0]:
                    self.host_waiting = max(0.0, min(1.0, (now[1] - self.pressure[1]) / (now[0] - self.pressure[0])))
                self.pressure = now
            if self.on_snapshot is not None:
                try:
                    self.on_snapshot(self.snapshot())
                except Exception:  # noqa: BLE001 - figures must never stop what they watch
                    pass

    def snapshot(self) -> Snapshot:
        with self.lock:
            return Snapshot(time.time(), dict(self.latest), self.host_share, self.host_waiting)

    def wait_for_figures(self, timeout_s: float) -> Snapshot:
        """Once every node has figures (two samples), or the timeout passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.latest) >= len(self.processes) and self.host_share is not None:
                    break
            time.sleep(0.05)
        return self.snapshot()

    def close(self) -> None:
        self.stopped.set()
        with self.lock:
            started = list(self.processes.values())
        for process in started:
            process.close()
        for process in started:
            process.wait(3)
