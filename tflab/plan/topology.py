"""The lab as a pure plan: nodes, roles, GPU blocks, ports and environment. No I/O here."""

from __future__ import annotations

import ipaddress
import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tflab.errors import UserError
from tflab.plan import shares
from tflab.plan.gpus import Gpu
from tflab.plan.shares import HostFacts, Share

GRPC_PORT = 2222
SSH_PORT_BASE = 20022
TENSORBOARD_PORT_BASE = 26006
MAX_PORT = 65535
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Topology:
    """What the user asked for: the options of `tflab gen`, as kept in tflab.yaml."""

    nodes: int
    ps: int | None = None  # None: one parameter server when there are two nodes or more
    chief: bool = False
    evaluator: bool = False
    gpus_per_node: int = 0
    share_gpus: bool = False
    ssh_port_base: int = SSH_PORT_BASE
    tensorboard_port_base: int = TENSORBOARD_PORT_BASE
    bind: str = LOOPBACK
    cpus_per_node: str = shares.AUTO  # auto | 0 | N | a fraction (see plan.shares)
    memory_per_node: str = shares.AUTO  # auto | 0 | SIZE

    @property
    def ps_count(self) -> int:
        """The number of parameter servers, the default applied."""
        if self.ps is not None:
            return self.ps
        return 1 if self.nodes >= 2 else 0


@dataclass(frozen=True)
class Node:
    """One container of the lab, as a separate machine would be."""

    name: str
    job: str  # ps | worker | chief | evaluator
    task_index: int
    position: int  # place in the lab; decides its GPU block and its ports
    gpus: tuple[int, ...]
    ssh_port: int
    tensorboard_port: int
    gpu_memory_fraction: float | None = None
    gpu_memory_mib: int | None = None
    share: Share = Share()  # its share of the host: CPUs and memory
    env: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Lab:
    """The whole plan: every node, and the cluster they form."""

    topology: Topology
    nodes: tuple[Node, ...]
    cluster: dict[str, list[str]]

    def node(self, name: str) -> Node:
        """The node called `name`, or a UserError listing the lab's nodes."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise UserError(f"no node {name!r} in this lab; its nodes are {', '.join(self.names)}")

    @property
    def names(self) -> list[str]:
        """Node names in lab order."""
        return [n.name for n in self.nodes]

    @property
    def chief(self) -> Node:
        """The node that coordinates: `chief` when the lab has one, else worker0."""
        for node in self.nodes:
            if node.job == "chief":
                return node
        for node in self.nodes:
            if node.job == "worker" and node.task_index == 0:
                return node
        return self.nodes[0]


def roles(topology: Topology) -> list[tuple[str, int]]:
    """(job, task_index) of every node in lab order: ps first, then workers, chief, evaluator."""
    check_counts(topology)
    ps = topology.ps_count
    planned = [("ps", i) for i in range(ps)]
    planned += [("worker", i) for i in range(topology.nodes - ps)]
    if topology.chief:
        planned.append(("chief", 0))
    if topology.evaluator:
        planned.append(("evaluator", 0))
    return planned


def node_name(job: str, task_index: int) -> str:
    """ps0, worker2; `chief` and `evaluator` are single and carry no index."""
    return job if job in ("chief", "evaluator") else f"{job}{task_index}"


MAX_NODES = 4096  # what tflab.yaml opens


def check_counts(topology: Topology) -> None:
    """Reject topologies TensorFlow cannot run, with the flag to change."""
    if topology.nodes < 1:
        raise UserError(f"--nodes must be at least 1, not {topology.nodes}")
    try:
        ipaddress.ip_address(topology.bind)
    except ValueError:
        raise UserError(f"--bind {topology.bind!r} is not an IP address (such as 127.0.0.1, or 0.0.0.0 for every "
                        "interface)") from None
    if topology.nodes > MAX_NODES:
        raise UserError(f"--nodes {topology.nodes} is more than a lab holds (at most {MAX_NODES})")
    if topology.ps is not None and topology.ps < 0:
        raise UserError(f"--ps cannot be negative ({topology.ps})")
    if topology.gpus_per_node < 0:
        raise UserError(f"--gpus-per-node cannot be negative ({topology.gpus_per_node})")
    ps = topology.ps_count
    if ps >= topology.nodes:
        raise UserError(
            f"--ps {ps} leaves no worker among {topology.nodes} node(s); "
            f"use --ps {max(topology.nodes - 1, 0)} or more --nodes"
        )


def gpu_blocks(
    gpus: Sequence[int], node_count: int, per_node: int, share: bool = False
) -> list[tuple[int, ...]]:
    """Node i gets the i-th block of `per_node` GPUs in listed order.

    Without `share`, asking for more GPUs than listed is an error; with it, blocks wrap
    around the list so several nodes use one GPU.
    """
    if per_node == 0:
        return [() for _ in range(node_count)]
    if not gpus:
        raise UserError(
            f"--gpus-per-node {per_node} needs GPUs, but this host has none "
            "(no nvidia-smi found); use --gpus 0-7 to generate for another host, "
            "or --gpus-per-node 0 for a CPU lab"
        )
    wanted = node_count * per_node
    if wanted > len(gpus) and not share:
        raise UserError(
            f"the lab needs {wanted} GPUs ({node_count} nodes x {per_node}) but the host has "
            f"{len(gpus)}; use fewer --nodes or --gpus-per-node, or --share-gpus to share them"
        )
    if per_node > len(gpus):
        raise UserError(
            f"--gpus-per-node {per_node} is more than the {len(gpus)} GPUs the host has, "
            "even with sharing"
        )
    return [
        tuple(gpus[(i * per_node + j) % len(gpus)] for j in range(per_node))
        for i in range(node_count)
    ]


def memory_fractions(blocks: Sequence[tuple[int, ...]]) -> list[float | None]:
    """Each node's share of its GPUs' memory: None unless a GPU is shared."""
    users = Counter(g for block in blocks for g in block)
    fractions: list[float | None] = []
    for block in blocks:
        sharers = max((users[g] for g in block), default=1)
        fractions.append(None if sharers <= 1 else math.floor(100 / sharers) / 100)
    return fractions


def check_ports(topology: Topology, node_count: int) -> None:
    """Both port ranges fit below 65536 and do not overlap."""
    for flag, base in (
        ("--ssh-port-base", topology.ssh_port_base),
        ("--tensorboard-port-base", topology.tensorboard_port_base),
    ):
        if base < 1:
            raise UserError(f"{flag} {base} is not a port")
        last = base + node_count - 1
        if last > MAX_PORT:
            raise UserError(
                f"{flag} {base} with {node_count} nodes runs to port {last}, past {MAX_PORT}; "
                f"use a base of at most {MAX_PORT - node_count + 1}"
            )
    ssh = set(range(topology.ssh_port_base, topology.ssh_port_base + node_count))
    tb = set(range(topology.tensorboard_port_base, topology.tensorboard_port_base + node_count))
    if ssh & tb:
        raise UserError("--ssh-port-base and --tensorboard-port-base ranges overlap; move one")


def cluster_spec(planned: Sequence[tuple[str, int]]) -> dict[str, list[str]]:
    """TF's cluster: every job's tasks as host:port. The evaluator is not part of it (TF rule)."""
    cluster: dict[str, list[str]] = {}
    for job in ("chief", "ps", "worker"):
        hosts = [f"{node_name(j, i)}:{GRPC_PORT}" for j, i in planned if j == job]
        if hosts:
            cluster[job] = hosts
    return cluster


def cluster_env(job: str, task_index: int, cluster: dict[str, list[str]]) -> dict[str, str]:
    """The variables that say the cluster: TF_CONFIG, the ps and worker host lists, the chief's host."""
    env = {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": task_index}}),
        "TFLAB_PS_HOSTS": ",".join(cluster.get("ps", [])),
        "TFLAB_WORKER_HOSTS": ",".join(cluster.get("worker", [])),
    }
    if "chief" in cluster:
        env["TFLAB_CHIEF_HOST"] = cluster["chief"][0]
    return env


def node_env(
    job: str, task_index: int, cluster: dict[str, list[str]], gpus: int, fraction: float | None,
    memory_mib: int | None, share: Share = Share(), host_cpus: int = 0,
) -> dict[str, str]:
    """The environment every node sees (DESIGN.md): TF_CONFIG and the TFLAB_* variables."""
    env = {
        **cluster_env(job, task_index, cluster),
        "TFLAB_NODE": node_name(job, task_index),
        "TFLAB_JOB_NAME": job,
        "TFLAB_TASK_INDEX": str(task_index),
        "TFLAB_NUM_GPUS": str(gpus),
        "PYTHONUNBUFFERED": "1",
        # TensorFlow's C++ INFO and WARNING lines drown the training output; errors stay
        # (a task may set TF_CPP_MIN_LOG_LEVEL=0 to see them all).
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    if share.cpus is not None or host_cpus:
        cpus = share.num_cpus(host_cpus)
        env["TFLAB_NUM_CPUS"] = str(cpus)
        if share.cpus is not None:
            # What the node owns is what its programs see: nproc honours OMP_NUM_THREADS, TensorFlow
            # sizes its thread pools from these (a quota, unlike a cpuset, hides no CPU from them).
            env["OMP_NUM_THREADS"] = str(cpus)
            env["TF_NUM_INTRAOP_THREADS"] = str(cpus)
            env["TF_NUM_INTEROP_THREADS"] = str(max(2, cpus))
    if share.memory_mib is not None:
        env["TFLAB_MEMORY_MB"] = str(share.memory_mib)
    if fraction is not None:
        env["TFLAB_GPU_MEMORY_FRACTION"] = f"{fraction:.2f}"
        if memory_mib:
            env["TFLAB_GPU_MEMORY_MB"] = str(memory_mib)
    return env


def plan(topology: Topology, host_gpus: Sequence[Gpu], host: HostFacts = HostFacts()) -> Lab:
    """The lab for `topology` on a host with `host_gpus` and `host`'s CPUs and memory (pure: the same input,
    the same lab)."""
    planned = roles(topology)
    check_ports(topology, len(planned))
    indices = [g.index for g in host_gpus]
    blocks = gpu_blocks(indices, len(planned), topology.gpus_per_node, topology.share_gpus)
    fractions = memory_fractions(blocks)
    node_shares = shares.split(topology.cpus_per_node, topology.memory_per_node, blocks, host)
    memory = {g.index: g.memory_mib for g in host_gpus}
    cluster = cluster_spec(planned)
    nodes = []
    for position, ((job, index), block, fraction, node_share) in enumerate(zip(planned, blocks, fractions, node_shares)):
        share_mib = None
        if fraction is not None and block and all(memory.get(g) for g in block):
            share_mib = int(min(memory[g] for g in block) * fraction)
        nodes.append(
            Node(
                name=node_name(job, index),
                job=job,
                task_index=index,
                position=position,
                gpus=block,
                ssh_port=topology.ssh_port_base + position,
                tensorboard_port=topology.tensorboard_port_base + position,
                gpu_memory_fraction=fraction,
                gpu_memory_mib=share_mib,
                share=node_share,
                env=node_env(job, index, cluster, len(block), fraction, share_mib, node_share, len(host.cpus)),
            )
        )
    return Lab(topology=topology, nodes=tuple(nodes), cluster=cluster)
