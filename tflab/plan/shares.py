"""A node is a machine: its share of the host's CPUs and memory, split the way the GPUs are. Pure.

On the seeds' 8-GPU server the four "2-GPU machines" would each own their cores (the ones
of their GPUs' NUMA node, as on a real two-socket server) and their memory. The split:

- CPUs `auto`: an even share of the host's CPUs per node, as a cpuset of whole CPUs, taken
  from the NUMA node of the node's GPUs first; where there are fewer CPUs than nodes, a CPU
  quota (a fraction of a CPU) instead. `N` (whole): N CPUs each, as a cpuset. `F` (a
  fraction): a quota of F CPUs each. `0`: shared, nothing owned.
- Memory `auto`: an even share of the host's memory after a reserve for the host. `SIZE`:
  that much each. `0`: no limit.

Asking for more CPUs or memory than the host has is an error that says how much there is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tflab.errors import UserError

BYTE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30}


def size_bytes(size: str, name: str = "") -> int:
    """A Docker size (`2g`, `512m`, `1073741824`) in bytes; a UserError (naming `name`) for what the engine refuses."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", size)
    if not match or match.group(2).lower() not in BYTE_UNITS:
        raise UserError(f"{name + ' ' if name else ''}{size!r} is not a size: write a number and a unit, "
                        "such as 2g or 512m")
    return int(float(match.group(1)) * BYTE_UNITS[match.group(2).lower()])

AUTO = "auto"
SHARED = "0"
# What the host keeps for itself before its memory is split: a tenth, between 1 and 16 GiB.
RESERVE_SHARE, RESERVE_MIN_MIB, RESERVE_MAX_MIB = 0.10, 1024, 16 * 1024
MIN_NODE_MIB = 64
MIN_CPUS = 0.01  # the smallest CPU quota the engine sets (1 ms in a 100 ms period)
MAX_CPUS = 4096
MAX_MIB = 2**30  # 1 PiB
SIZE_UNITS = {"": 2**-20, "b": 2**-20, "k": 2**-10, "kb": 2**-10, "m": 1, "mb": 1, "g": 2**10, "gb": 2**10,
              "t": 2**20, "tb": 2**20}


@dataclass(frozen=True)
class HostFacts:
    """What the split needs of the host: its CPUs (by NUMA node), its GPUs' NUMA nodes, its memory."""

    cpus: tuple[int, ...] = ()
    numa_cpus: dict[int, tuple[int, ...]] = field(default_factory=dict)  # NUMA node -> its CPUs
    gpu_numa: dict[int, int] = field(default_factory=dict)  # host GPU index -> NUMA node
    memory_mib: int = 0


@dataclass(frozen=True)
class Share:
    """One node's share of the host."""

    cpuset: tuple[int, ...] = ()  # CPUs it owns alone (empty: none)
    quota: float | None = None  # CPUs' worth of time it may use, where it owns no cpuset
    memory_mib: int | None = None  # its memory limit (None: no limit)
    numa: int | None = None  # the NUMA node its cpuset lies on, when one

    @property
    def cpus(self) -> float | None:
        """The CPUs it owns: its cpuset's size or its quota; None when it shares the host's."""
        if self.cpuset:
            return float(len(self.cpuset))
        return self.quota

    def num_cpus(self, host_cpus: int) -> int:
        """Its CPUs rounded up, as its programs should size their thread pools (the host's when shared)."""
        owned = self.cpus
        return max(1, math.ceil(owned)) if owned is not None else max(1, host_cpus)


def cpu_list(cpus: Sequence[int]) -> str:
    """CPUs as the kernel and Docker write them: `0-7,16-23`."""
    parts: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in ordered + [None]:  # type: ignore[list-item]
        if start is not None and (cpu is None or cpu != (prev or 0) + 1):
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(parts)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """`0-7,16-23` (the kernel's cpulist) as CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ValueError(f"not a CPU list: {text!r}")
        first = int(match.group(1))
        cpus.extend(range(first, int(match.group(2) or first) + 1))
    return tuple(cpus)


def check_cpu_choice(value: str, flag: str = "--cpus-per-node") -> str:
    """`auto`, `0`, a whole number of CPUs, or a fraction of one: normalised, or a UserError."""
    text = str(value).strip().lower()
    if text in (AUTO, SHARED):
        return text
    try:
        number = float(text)
    except ValueError:
        raise UserError(f"{flag} {value!r} is not auto, 0, or a number of CPUs (2, or 0.5 for half of one)") from None
    if not math.isfinite(number) or number < 0:
        raise UserError(f"{flag} {value!r} must be a positive number of CPUs, auto, or 0")
    if number == 0:
        return SHARED
    if number < MIN_CPUS:
        raise UserError(f"{flag} {value!r} is less than the engine can give a node: use at least {MIN_CPUS:g}, "
                        "or 0 to share the host's CPUs")
    if number > MAX_CPUS:
        raise UserError(f"{flag} {value!r} is more CPUs than any host has (at most {MAX_CPUS})")
    return f"{int(number)}" if number == int(number) else f"{number:g}"


def size_mib(size: str, flag: str = "--memory-per-node") -> int:
    """A size such as `512m`, `5g`, `1.5g` in MiB (a number without its unit is refused, 0 aside)."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(size))
    if (not match or match.group(2).lower() not in SIZE_UNITS
            or (not match.group(2) and float(match.group(1)) != 0)):
        raise UserError(f"{flag} {size!r} is not a size: write a number and a unit, such as 512m or 4g")
    mib = float(match.group(1)) * SIZE_UNITS[match.group(2).lower()]
    if mib > MAX_MIB:
        raise UserError(f"{flag} {size!r} is more memory than any host has")
    return math.ceil(mib) if 0 < mib < 1 else int(mib)


def check_memory_choice(value: str, flag: str = "--memory-per-node") -> str:
    """`auto`, `0`, or a size of at least 64 MiB: normalised, or a UserError."""
    text = str(value).strip().lower()
    if text in (AUTO, SHARED):
        return text
    mib = size_mib(text, flag)
    if mib == 0:
        return SHARED
    if mib < MIN_NODE_MIB:
        raise UserError(f"{flag} {value!r} is too little for a node (its sshd alone needs some): use at least 64m")
    return text


def memory_text(mib: int | None) -> str:
    """A limit as people read it: `5.4G`, `256M`, or `-`."""
    if mib is None:
        return "-"
    return f"{mib / 1024:.1f}G" if mib >= 1024 else f"{mib}M"


def reserve_mib(total_mib: int) -> int:
    """What the host keeps for itself before its memory is split."""
    return int(min(RESERVE_MAX_MIB, max(RESERVE_MIN_MIB, total_mib * RESERVE_SHARE)))


def numa_of(gpus: Sequence[int], host: HostFacts) -> int | None:
    """The NUMA node most of a node's GPUs sit on (None for a CPU node, or where the host does not say)."""
    nodes = [host.gpu_numa[g] for g in gpus if g in host.gpu_numa and host.gpu_numa[g] >= 0]
    if not nodes:
        return None
    return max(sorted(set(nodes)), key=nodes.count)


def cpusets(per_node: int, blocks: Sequence[tuple[int, ...]], host: HostFacts) -> list[tuple[tuple[int, ...], int | None]]:
    """Each node's `per_node` CPUs, from its GPUs' NUMA node first; (cpuset, NUMA node or None) per node.

    Nodes with a NUMA preference choose first; the others then take CPUs from the NUMA node with
    the most left, so that a node stays on one NUMA node wherever it can.
    """
    online = set(host.cpus)
    free = {node: [c for c in cpus if c in online] for node, cpus in sorted(host.numa_cpus.items())}
    placed = {c for cpus in free.values() for c in cpus}
    leftover = [c for c in host.cpus if c not in placed]
    if leftover or not free:
        free.setdefault(-1, []).extend(leftover)
    wanted = [numa_of(block, host) for block in blocks]
    order = sorted(range(len(blocks)), key=lambda i: (wanted[i] is None, i))
    out: list[tuple[tuple[int, ...], int | None]] = [((), None)] * len(blocks)
    for i in order:
        taken: list[int] = []
        home = wanted[i]
        preference: list[int] = [home] if home is not None and home in free else []
        preference += sorted((n for n in free if n not in preference), key=lambda n: (-len(free[n]), n))
        for numa in preference:
            need = per_node - len(taken)
            if need <= 0:
                break
            taken += free[numa][:need]
            free[numa] = free[numa][need:]
        homes = {n for n, cpus in host.numa_cpus.items() if set(taken) <= set(cpus)}
        out[i] = (tuple(sorted(taken)), next(iter(homes)) if len(homes) == 1 else None)
    return out


def split(cpu_choice: str, memory_choice: str, blocks: Sequence[tuple[int, ...]], host: HostFacts) -> list[Share]:
    """Every node's share: `blocks` are the nodes' GPU blocks, in lab order."""
    count = len(blocks)
    cpus = host.cpus
    cpu_choice, memory_choice = check_cpu_choice(cpu_choice), check_memory_choice(memory_choice)
    sets: list[tuple[tuple[int, ...], int | None]] = [((), None)] * count
    quota: float | None = None
    if cpu_choice == AUTO and cpus:
        per_node = len(cpus) // count
        if per_node >= 1:
            sets = cpusets(per_node, blocks, host)
        else:
            quota = math.floor(len(cpus) / count * 100) / 100  # the shares never add up to more than the host
            if quota < MIN_CPUS:
                raise UserError(f"{len(cpus)} CPUs over {count} nodes give each less than {MIN_CPUS:g} CPU, the "
                                "least the engine sets; use fewer --nodes, or --cpus-per-node 0 to share them")
    elif cpu_choice not in (AUTO, SHARED):
        wanted = float(cpu_choice)
        if cpus and wanted * count > len(cpus):
            raise UserError(
                f"the lab needs {wanted * count:g} CPUs ({count} nodes x {cpu_choice}) but the host has {len(cpus)}; "
                f"use --cpus-per-node auto (an even share), a fraction such as "
                f"{math.floor(len(cpus) / count * 100) / 100:g}, or 0 to share them")
        if wanted == int(wanted):
            sets = cpusets(int(wanted), blocks, host)
        else:
            quota = wanted
    memory: int | None = None
    if memory_choice == AUTO and host.memory_mib:
        memory = (host.memory_mib - reserve_mib(host.memory_mib)) // count
        if memory < MIN_NODE_MIB:
            raise UserError(f"{memory_text(host.memory_mib)} of memory over {count} nodes gives each {memory_text(memory)}, "
                            f"less than a node needs ({MIN_NODE_MIB}M); use fewer --nodes, or --memory-per-node 0 "
                            "to share it")
    elif memory_choice not in (AUTO, SHARED):
        memory = size_mib(memory_choice)
        if host.memory_mib and memory * count > host.memory_mib:
            raise UserError(
                f"the lab needs {memory_text(memory * count)} of memory ({count} nodes x {memory_choice}) but the "
                f"host has {memory_text(host.memory_mib)}; use --memory-per-node auto, a smaller size, or 0")
    return [Share(cpuset=cpuset, quota=quota if not cpuset else None, memory_mib=memory, numa=numa)
            for cpuset, numa in sets]


def check_cpus_fit(share: Share, cpus: float, host_cpus: int, node: str, what: str) -> None:
    """A UserError, saying `what` was asked, where `cpus` is more CPU than `node` can use: its pinned CPUs, or
    the host's where it has none (for `run --cpus` and `fault cpu`)."""
    most = len(share.cpuset) or host_cpus
    if most and cpus > most:
        pinned = len(share.cpuset)
        where = f"its {pinned} pinned CPU{'s' if pinned > 1 else ''}" if pinned else f"the host's {most} CPUs"
        raise UserError(f"{what}: {node} runs on {where}, so it cannot have more than {most:g} CPU")


# What one TensorFlow program needs to start in reasonable time: its import takes about 6 CPU-s, and the process
# about 0.7 GiB before the model (measured on tflab-base:cpu, TensorFlow 2.21).
IMPORT_CPU_S, LEAST_CPUS, LEAST_MIB = 6.0, 0.25, 1024


def too_small(share: Share) -> str | None:
    """Why a node of this share would start TensorFlow too slowly or not at all, or None."""
    said = []
    cpus = share.cpus
    if cpus is not None and cpus < LEAST_CPUS:
        said.append(f"{cpus:g} CPU: importing TensorFlow (about {IMPORT_CPU_S:g} CPU-s) takes about "
                    f"{IMPORT_CPU_S / cpus:.0f} s at that")
    if share.memory_mib is not None and share.memory_mib < LEAST_MIB:
        said.append(f"{memory_text(share.memory_mib)} of memory: a TensorFlow process takes about 0.7G before its "
                    "model")
    if not said:
        return None
    return ("each node has " + " and ".join(said) + ": fewer --nodes, or --cpus-per-node 0 and --memory-per-node 0 "
            "to share the host's (`tflab set` changes them)")
