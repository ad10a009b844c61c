"""What this host has: its GPUs as nvidia-smi lists them, its CPUs and NUMA nodes, its memory."""

from __future__ import annotations

import os
import re
import resource
from pathlib import Path

from tflab.errors import CommandError, UserError
from tflab.host.proc import Runner
from tflab.plan.gpus import Gpu, parse_nvidia_smi, parse_topo_numa, sysfs_bus_id
from tflab.plan.shares import HostFacts, parse_cpu_list

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader",
]


def discover(runner: Runner) -> list[Gpu]:
    """The host's GPUs as nvidia-smi lists them; [] when there is no nvidia-smi."""
    try:
        return parse_nvidia_smi(runner(NVIDIA_SMI_QUERY))
    except UserError as exc:
        if "not installed" in str(exc):
            return []
        raise
    except CommandError as exc:
        # nvidia-smi without a working driver: no usable GPU on this host.
        if "NVIDIA-SMI has failed" in exc.output or "couldn't communicate" in exc.output:
            return []
        raise UserError(f"nvidia-smi failed: {exc}") from exc


# Where the host describes itself (tests point them at a fake sysfs).
SYSFS = Path("/sys")
MEMINFO = Path("/proc/meminfo")
NVIDIA_SMI_TOPO = ["nvidia-smi", "topo", "-m"]
NVIDIA_SMI_BUS = ["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def online_cpus() -> tuple[int, ...]:
    """The host's online CPUs (sysfs), else the CPUs this process may run on."""
    text = _read(SYSFS / "devices" / "system" / "cpu" / "online")
    if text and text.strip():
        return parse_cpu_list(text)
    return tuple(sorted(os.sched_getaffinity(0)))


def numa_cpus() -> dict[int, tuple[int, ...]]:
    """Each NUMA node's CPUs (sysfs `node*/cpulist`); {} where the host does not say."""
    found: dict[int, tuple[int, ...]] = {}
    for folder in sorted((SYSFS / "devices" / "system" / "node").glob("node[0-9]*")):
        text = _read(folder / "cpulist")
        if text is not None and text.strip():
            found[int(folder.name[4:])] = parse_cpu_list(text)
    return found


def memory_mib() -> int:
    """The host's memory (MemTotal)."""
    match = re.search(r"^MemTotal:\s+(\d+) kB", _read(MEMINFO) or "", re.MULTILINE)
    return int(match.group(1)) // 1024 if match else 0


def gpu_numa(runner: Runner, gpus: list[Gpu]) -> dict[int, int]:
    """Each GPU's NUMA node: `nvidia-smi topo -m`, else sysfs by the GPU's PCI bus id; {} without nvidia-smi."""
    if not gpus:
        return {}
    try:
        found = parse_topo_numa(runner(NVIDIA_SMI_TOPO))
        if found:
            return found
        listing = runner(NVIDIA_SMI_BUS)
    except (CommandError, UserError):
        return {}
    found = {}
    for line in listing.splitlines():
        index, _, bus = line.partition(",")
        text = _read(SYSFS / "bus" / "pci" / "devices" / sysfs_bus_id(bus) / "numa_node") if bus.strip() else None
        if index.strip().isascii() and index.strip().isdigit() and text and text.isascii() and text.strip().lstrip("-").isdigit() and int(text) >= 0:
            found[int(index)] = int(text)
    return found


def host_facts(runner: Runner, gpus: list[Gpu]) -> HostFacts:
    """What the CPU and memory split needs of this host."""
    return HostFacts(cpus=online_cpus(), numa_cpus=numa_cpus(), gpu_numa=gpu_numa(runner, gpus), memory_mib=memory_mib())


def cpu_times(path: Path = Path("/proc/stat")) -> tuple[float, float] | None:
    """(busy, total) CPU time of the whole host so far, in jiffies (/proc/stat's `cpu` line)."""
    text = _read(path)
    if not text or not text.startswith("cpu "):
        return None
    values = [float(v) for v in text.splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0.0)  # idle and iowait
    total = sum(values[:8])  # guest time is counted in user already
    return total - idle, total


def cpu_pressure(path: Path = Path("/proc/pressure/cpu")) -> float | None:
    """Seconds in which some runnable task waited for a CPU, so far (the kernel's CPU pressure, its `some`
    total); None where the kernel keeps none. It counts what no busy share shows: tasks held back by a CPU
    quota or a cpuset above tflab (a container's, a CI runner's), which leave the host's CPUs idle."""
    for line in (_read(path) or "").splitlines():
        if line.startswith("some "):
            total = next((f[6:] for f in line.split() if f.startswith("total=")), "")
            return int(total) / 1e6 if total.isdigit() else None
    return None


def memlock_limit() -> int:
    """The most locked memory a container may get here: unlimited (-1) where the host allows it."""
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    return -1 if hard == resource.RLIM_INFINITY else hard
