"""Host GPUs as data: nvidia-smi's listing parsed, or what the user lists with --gpus."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tflab.errors import UserError


@dataclass(frozen=True)
class Gpu:
    """One host GPU as the engine's device reservation names it (`index`)."""

    index: int
    uuid: str = ""
    name: str = ""
    memory_mib: int = 0


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader`."""
    gpus: list[Gpu] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not (fields[0].isascii() and fields[0].isdigit()):
            raise UserError(f"cannot read this line of nvidia-smi's output: {line.strip()!r}")
        memory = re.match(r"(\d+)", fields[3])
        gpus.append(
            Gpu(
                index=int(fields[0]),
                uuid=fields[1],
                name=fields[2],
                memory_mib=int(memory.group(1)) if memory else 0,
            )
        )
    return gpus


MAX_GPUS = 1024


def parse_gpu_list(spec: str) -> list[Gpu]:
    """Parse an explicit `--gpus` list: `0-7`, `0,1,4,5` or a mix such as `0-3,6`."""
    indices: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part)
        if not match:
            raise UserError(
                f"--gpus {spec!r} is not a GPU list: write indices and ranges such as 0-7 or 0,1,4,5"
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise UserError(f"--gpus {spec!r}: the range {part} runs backwards")
        if last >= MAX_GPUS:
            raise UserError(f"--gpus {spec!r}: GPU {last} is past the last a host can have ({MAX_GPUS - 1})")
        indices.extend(range(first, last + 1))
    if len(set(indices)) != len(indices):
        raise UserError(f"--gpus {spec!r} lists a GPU twice")
    return [Gpu(index=i) for i in indices]




ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topo_numa(text: str) -> dict[int, int]:
    """GPU index -> NUMA node from `nvidia-smi topo -m` (its "NUMA Affinity" column); {} when it has none."""
    lines = [ANSI.sub("", line).rstrip() for line in text.splitlines()]
    header = next((line for line in lines if "NUMA Affinity" in line), None)
    if header is None:
        return {}
    columns = [cell.strip() for cell in header.split("\t")]
    numa_at = columns.index("NUMA Affinity")
    found: dict[int, int] = {}
    for line in lines:
        cells = [cell.strip() for cell in line.split("\t")]
        match = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if not match or len(cells) <= numa_at:
            continue
        value = cells[numa_at]
        if re.fullmatch(r"\d+", value):
            found[int(match.group(1))] = int(value)
    return found


def sysfs_bus_id(bus_id: str) -> str:
    """nvidia-smi's PCI bus id (`00000000:18:00.0`) as sysfs names the device (`0000:18:00.0`)."""
    domain, _, rest = bus_id.strip().partition(":")
    return f"{domain[-4:]}:{rest}".lower()
