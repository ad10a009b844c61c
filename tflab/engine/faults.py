"""Faults on purpose, done to a lab's nodes, and healed: the engine for the machine, tc and iptables in the node.

kill, stop, restart and pause are the engine's (SIGKILL, a shutdown, a reboot, the cgroup
freezer); a CPU quota is the container's; slow and cut are done inside the node by its
fault.sh (tc, and iptables rules in a chain of tflab's own), which needs NET_ADMIN. Healing
puts back what the lab's plan says: its links, its quotas, every node running and unfrozen.
What tflab downed is noted in the lab's state folder, so `tflab fault clear` brings it back
even from another terminal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from tflab.engine import daemon
from tflab.engine.backend import LabBackend
from tflab.engine.compose_up import CPU_PERIOD
from tflab.engine.containers import lab_containers
from tflab.engine.executors import Executor
from tflab.errors import EngineError, TflabError, UserError
from tflab.host.fanout import parallel
from tflab.host.labfiles import LabFiles
from tflab.host.ports import wait_for_ssh
from tflab.plan import links, shares
from tflab.plan.faults import NEEDS_NET_ADMIN, Fault

FAULT_SH = "/usr/local/share/tflab/fault.sh"
SHAPE_SH = "/usr/local/share/tflab/shape.sh"
DOWNED_FILE = "faults-downed.json"
REVIVE_TIMEOUT_S = 120.0


class FaultInjector:
    """Does faults to the nodes of one lab on this host's engine, and heals them."""

    def __init__(self, lf: LabFiles, client: docker.DockerClient, executor_for: Callable[[list[str]], Executor],
                 ssh_target: Callable[[str], tuple[str, int]]) -> None:
        self.lf = lf
        self.client = client
        self.executor_for = executor_for
        self.ssh_target = ssh_target

    @classmethod
    def for_lab(cls, lf: LabFiles, side: LabBackend) -> FaultInjector:
        """The injector of the lab whose engine side is `side`."""
        return cls(lf, daemon.client(), side.executor, lambda node: side.ssh_targets()[node])

    # -- what is there ----------------------------------------------------------------------

    def container(self, node: str) -> Container:
        found = lab_containers(self.client, self.lf.project).get(node)
        if found is None:
            raise UserError(f"node {node} is not on this host's engine; `tflab up` starts the lab "
                            "(faults are done through the engine that runs the node)")
        return found

    def check(self, fault: Fault) -> None:
        """A one-line error for a fault this lab cannot take."""
        if fault.action in NEEDS_NET_ADMIN and not self.lf.config.net_admin:
            raise UserError(f"{fault.action} changes a node's network, which needs the NET_ADMIN capability: give "
                            "the lab that: `tflab set --faults` (or --link-rate RATE), then `tflab up`")
        if fault.action == "cpu" and fault.share is not None:
            shares.check_cpus_fit(self.lf.lab.node(fault.node).share, fault.share, len(self.lf.config.host.cpus),
                                  fault.node, f"cpu {fault.node} {fault.share:g}")
        self.container(fault.node)

    def _fault_sh(self, node: str, *args: str) -> str:
        code, out = self.executor_for([node]).run(node, [FAULT_SH, *args])
        if code != 0:
            raise EngineError(f"{args[0]} on {node} failed: {out.strip() or code}")
        return out

    # -- doing -------------------------------------------------------------------------------

    def apply(self, fault: Fault) -> str:
        """Do `fault` now; what was done, in words."""
        self.check(fault)
        node = fault.node
        container = self.container(node)
        try:
            if fault.action == "kill":
                self._note_downed(node)
                container.kill()
                return f"killed {node} (its machine: SIGKILL to every process)"
            if fault.action == "stop":
                self._note_downed(node)
                container.stop(timeout=10)
                return f"stopped {node} (a shutdown: SIGTERM, then SIGKILL after 10 s)"
            if fault.action == "restart":
                container.restart(timeout=5)
                self._wait_ready(node)
                return f"restarted {node} (a reboot: its processes ended, the machine back)"
            if fault.action == "pause":
                container.pause()
                return f"paused {node} (frozen: the cgroup freezer)"
            if fault.action == "cpu":
                self.set_cpu(node, fault.share or 0.0)
                return f"{node} now has {fault.share:g} CPU"
        except docker.errors.APIError as exc:
            raise EngineError(f"{fault.describe()} failed: {exc.explanation or exc}") from exc
        if fault.action == "slow":
            self.slow(node, fault.rate or "")
            return f"{node}'s link now sends at {fault.rate}"
        if fault.action == "cut":
            peers = list(fault.peers) or [n for n in self.lf.lab.names if n != node]
            self._fault_sh(node, "cut", *peers)
            return f"cut {node} off from {', '.join(peers)}"
        raise UserError(f"no such fault: {fault.action}")

    def heal(self, fault: Fault) -> str:
        """Undo `fault`: what was done, in words."""
        node = fault.node
        if fault.action in ("kill", "stop"):
            self.revive(node)
            return f"{node} is back"
        container = self.container(node)
        if fault.action == "pause":
            container.reload()
            if container.status == "paused":
                container.unpause()
            return f"unpaused {node}"
        if fault.action == "cpu":
            self.restore_cpu(node)
            return f"{node} has its own CPU again"
        if fault.action == "slow":
            self.unslow(node)
            return f"{node}'s link is back to {self.lf.config.links.describe()}"
        if fault.action == "cut":
            self._fault_sh(node, "uncut")
            return f"{node} is reachable again"
        return f"nothing to heal for {fault.action} {node}"

    def revive(self, node: str) -> None:
        """Start a node's machine again (after kill or stop) and wait until it answers."""
        container = self.container(node)
        container.reload()
        if container.status == "paused":
            container.unpause()
        if container.status != "running":
            try:
                container.start()
            except docker.errors.APIError as exc:
                raise EngineError(f"cannot start {node} again: {exc.explanation or exc}") from exc
        self._wait_ready(node)
        self._note_downed(node, downed=False)

    def _wait_ready(self, node: str) -> None:
        if not wait_for_ssh(*self.ssh_target(node), time.monotonic() + REVIVE_TIMEOUT_S):
            raise EngineError(f"{node} did not answer within {REVIVE_TIMEOUT_S:.0f}s after it was started again")

    # -- links and CPU (faults, and a run's knobs) -------------------------------------------------

    def set_cpu(self, node: str, share: float) -> None:
        """Give `node` `share` CPUs' worth of time (a CFS quota: cgroup v1's cfs_quota_us, v2's cpu.max)."""
        try:
            self.container(node).update(cpu_period=CPU_PERIOD, cpu_quota=int(share * CPU_PERIOD))
        except docker.errors.APIError as exc:
            raise EngineError(f"giving {node} {share:g} CPU failed: {exc.explanation or exc}") from exc

    def restore_cpu(self, node: str) -> None:
        """`node`'s own CPU quota back, as the lab's plan says (none where it owns a cpuset or shares the host's)."""
        quota = self.lf.lab.node(node).share.quota
        try:
            self.container(node).update(cpu_period=CPU_PERIOD, cpu_quota=int(quota * CPU_PERIOD) if quota else -1)
        except docker.errors.APIError as exc:
            raise EngineError(f"restoring {node}'s CPU quota failed: {exc.explanation or exc}") from exc

    def slow(self, node: str, rate: str) -> None:
        """`node`'s link sends and receives at `rate` (tc, in the node; needs NET_ADMIN)."""
        self._fault_sh(node, "slow", rate, str(links.burst_bytes(rate)))

    def unslow(self, node: str) -> None:
        """`node`'s link back to the lab's own (shaped as the lab was made, or unshaped)."""
        self._fault_sh(node, "unslow")

    def present(self) -> list[str]:
        """The lab's nodes this host's engine has."""
        return [n for n in self.lf.lab.names if n in lab_containers(self.client, self.lf.project)]

    # -- healing everything ---------------------------------------------------------------------

    def clear(self) -> list[str]:
        """Heal everything tflab changed, on every node of the lab; what was healed."""
        healed: list[str] = []
        for node in sorted(self._downed()):
            self.revive(node)
            healed.append(f"{node} started again")

        def heal_node(node: str) -> list[str]:
            done = []
            container = self.container(node)
            if container.status == "paused":
                container.unpause()
                done.append(f"{node} unpaused")
            if container.status not in ("running", "paused"):
                return done  # stopped by hand, not by tflab: `tflab up` starts it
            if self._cpu_changed(node, container):
                self.restore_cpu(node)
                done.append(f"{node}'s CPU quota restored")
            if self.lf.config.net_admin:
                changed = self.changes(node)
                if any(line.startswith("cut") for line in changed):
                    self._fault_sh(node, "uncut")
                    done.append(f"{node}'s traffic no longer dropped")
                if any(line.startswith("qdisc") for line in changed):
                    self.unslow(node)
                    done.append(f"{node}'s link back to {self.lf.config.links.describe()}")
            return done

        for done in parallel(heal_node, [n for n in self.lf.lab.names
                                         if n in lab_containers(self.client, self.lf.project)], name="heal"):
            healed += done
        return healed

    def _cpu_changed(self, node: str, container: Container) -> bool:
        container.reload()
        host = container.attrs.get("HostConfig", {})
        quota = self.lf.lab.node(node).share.quota
        wanted = int(quota * CPU_PERIOD) if quota else 0
        have = host.get("CpuQuota") or 0
        return (have if have > 0 else 0) != wanted

    def changes(self, node: str) -> list[str]:
        """What tflab changed in a running node's network, as `fault.sh show` says it (the lab's own links aside)."""
        try:
            code, out = self.executor_for([node]).run(node, [FAULT_SH, "show"])
        except TflabError:
            return []
        lines = [line.strip() for line in out.splitlines() if line.strip()] if code == 0 else []
        own = links.rate_bits(self.lf.config.links.rate) if self.lf.config.links.rate else None
        return [line for line in lines if not (line.startswith("qdisc") and own and _tc_bits(line.split()[-1]) == own)]

    def state(self) -> dict[str, list[str]]:
        """Everything a fault left on each node: paused, stopped by tflab, its CPU quota, its network."""
        found: dict[str, list[str]] = {}
        downed = self._downed()
        for node, container in lab_containers(self.client, self.lf.project).items():
            left = []
            if node in downed:
                left.append("downed by a fault")
            if container.status == "paused":
                left.append("paused")
            if container.status == "running":
                if self._cpu_changed(node, container):
                    left.append("CPU quota changed")
                left += self.changes(node)
            if left:
                found[node] = left
        return found

    # -- what tflab downed --------------------------------------------------------------------

    def _downed_path(self) -> Path:
        return self.lf.state_file(DOWNED_FILE)

    def _downed(self) -> set[str]:
        try:
            return set(json.loads(self._downed_path().read_text()))
        except (OSError, ValueError):
            return set()

    def _note_downed(self, node: str, downed: bool = True) -> None:
        nodes = self._downed() | {node} if downed else self._downed() - {node}
        self._downed_path().write_text(json.dumps(sorted(nodes)))


def _tc_bits(shown: str) -> float | None:
    """A rate as `tc qdisc show` prints it (`100Mbit`, `1Gbit`, `800Kbit`), in bits per second."""
    try:
        return links.rate_bits(links.parse_rate(shown.lower()))
    except (TflabError, AssertionError):
        return None
