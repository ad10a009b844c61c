"""Host GPUs: what nvidia-smi reports, or what the user lists with --gpus."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tflab.errors import CommandError, UserError
from tflab.proc import Runner

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader",
]


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
        if len(fields) != 4 or not fields[0].isdigit():
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


def parse_gpu_list(spec: str) -> list[Gpu]:
    """Parse an explicit `--gpus` list: `0-7`, `0,1,4,5` or a mix such as `0-3,6`."""
    indices: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise UserError(
                f"--gpus {spec!r} is not a GPU list: write indices and ranges such as 0-7 or 0,1,4,5"
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise UserError(f"--gpus {spec!r}: the range {part} runs backwards")
        indices.extend(range(first, last + 1))
    if len(set(indices)) != len(indices):
        raise UserError(f"--gpus {spec!r} lists a GPU twice")
    return [Gpu(index=i) for i in indices]


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
