"""A run's cluster, watched: each node's figures written as TensorBoard scalars beside the model's own curves.

While `tflab run TASK` runs (in the foreground or detached), every second or two each node's
CPU, memory, network, GPUs and steps/s are written under `runs/TASK/cluster/NODE/` (one
TensorBoard run per node, so `tflab tensorboard` shows them side by side, and beside the loss).
The x-axis is the second of the run. The training's figures also tell, at the end, what limited
the run (`bottleneck`: a starved parameter server, a straggler, a link, memory, or the host).

Written with tensorboardX, which needs no TensorFlow on the host.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tflab.engine.executors import Executor
from tflab.engine.metrics import ClusterSampler, Snapshot
from tflab.host.fanout import background
from tflab.plan.topology import Lab
from tflab.run import bottleneck
from tflab.run.machine import RunMachine

log = logging.getLogger("tflab.cluster")
CLUSTER_DIR = "cluster"
RATE_WINDOW_S = 10.0


START_AFTER_RELEASE_S = 10.0


class ClusterWatch:
    """Samples the lab's nodes during a run; writes their scalars; keeps the series for the summary."""

    def __init__(self, executor: Executor, lab: Lab, folder: Path, machine: RunMachine, host_cpus: int,
                 every_s: float = 1.0, board: bool = True, link_mbit: float | None = None,
                 on_cpu: Callable[[dict[str, float | None]], None] | None = None) -> None:
        self.lab = lab
        self.on_cpu = on_cpu  # each snapshot's CPU use per node, for the run's stall rule
        self.shape = bottleneck.Shape(servers=machine.plan.servers, workers=machine.plan.finishers,
                                      cpus={n.name: n.share.cpus for n in lab.nodes}, host_cpus=host_cpus,
                                      link_mbit=link_mbit)
        self.folder = folder / CLUSTER_DIR
        self.machine = machine
        self.host_cpus = host_cpus
        self.board = board
        self.series = bottleneck.Series()
        self.writers: dict[str, Any] = {}
        self.began: float | None = None
        self.lock = threading.Lock()
        self.sampler = ClusterSampler(executor, lab.names, host_cpus, {n.name: n.gpus for n in lab.nodes},
                                      every_s=every_s, on_snapshot=self._snapshot)

    def start(self) -> ClusterWatch:
        """Start sampling once the training does (`_start_when_training`), beside the run."""
        background(self._start_when_training, name="cluster-start")
        return self

    def _start_when_training(self) -> None:
        """The nodes' figures are for the training (the limit, the stall rule, the scalars), so each node's metrics
        start at the workers' first step, or START_AFTER_RELEASE_S after their release at the latest (a run that
        never steps is judged by them too). Before, their interpreters would only take the CPU of the nodes'
        TensorFlow imports, which they do not measure."""
        released_at: float | None = None
        while not self.sampler.stopped.is_set() and self.machine.finish is None:
            if self.machine.released:
                released_at = released_at or time.monotonic()
                if self._training() or time.monotonic() - released_at >= START_AFTER_RELEASE_S:
                    self.sampler.start()
                    return
            time.sleep(0.2)

    def _writer(self, node: str) -> Any:
        writer = self.writers.get(node)
        if writer is None:
            from tensorboardX import SummaryWriter  # only runs import it

            writer = self.writers[node] = SummaryWriter(logdir=str(self.folder / node), flush_secs=2)
        return writer

    def _snapshot(self, snap: Snapshot) -> None:
        if self.on_cpu is not None:
            self.on_cpu({name: snap.nodes[name].cpu_used if name in snap.nodes else None for name in self.lab.names})
        with self.lock:
            self.began = self.began or snap.t
            if self._training():
                self.series.add(snap.host_busy, list(snap.nodes.values()), snap.host_waiting)
            if not self.board:
                return
            # TensorBoard's axis says "Step": the run's step it is (its furthest finisher's), beside the model's own
            # curves; the time is each point's wall time (TensorBoard's "Relative" and "Wall" axes).
            step = self.machine.run_step or 0
            for name, figures in snap.nodes.items():
                writer = self._writer(name)
                scalars = {
                    "cluster/cpu_used": figures.cpu_used, "cluster/cpu_share": figures.cpu_share,
                    "cluster/cpu_throttled": figures.throttled, "cluster/memory_mb": figures.memory_mb,
                    "cluster/memory_share": figures.memory_share, "cluster/net_rx_mbit": figures.rx_mbit,
                    "cluster/net_tx_mbit": figures.tx_mbit,
                }
                for gpu in figures.gpus:
                    scalars[f"cluster/gpu{gpu.index}_util"] = gpu.util
                    scalars[f"cluster/gpu{gpu.index}_memory_mb"] = gpu.memory_mb
                node = self.machine.nodes.get(name)
                if node is not None and name in self.machine.plan.finishers:
                    rate = node.rate(RATE_WINDOW_S) if node.running else None
                    scalars["cluster/steps_per_s"] = rate if rate is not None else 0.0
                for tag, value in scalars.items():
                    if value is not None:
                        writer.add_scalar(tag, value, global_step=step, walltime=snap.t)
            for tag, value in (("cluster/host_cpu_busy", snap.host_busy),
                               ("cluster/host_cpu_waiting", snap.host_waiting)):
                if value is not None:
                    self._writer("host").add_scalar(tag, value, global_step=step, walltime=snap.t)

    def _training(self) -> bool:
        """Whether the training runs: a worker has made progress, and the run has not ended."""
        machine = self.machine
        return machine.finish is None and any(machine.nodes[n].progressed for n in machine.plan.finishers
                                              if n in machine.nodes)

    def stop(self) -> bottleneck.Limit:
        """Stop sampling, write everything out; what limited the run."""
        self.sampler.close()
        with self.lock:
            for writer in self.writers.values():
                try:
                    writer.close()
                except OSError as exc:
                    log.debug("closing a cluster writer: %s", exc)
            return bottleneck.find(self.series, self.shape)
