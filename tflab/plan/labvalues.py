"""The kinds of value tflab.yaml holds, declared as types pydantic reads strictly (each with its JSON Schema).

A kind is a type with tflab's own rule beside it: a text (not empty), a choice, a node's CPU or memory share, a
size, an image name, a TensorFlow pin and a Keras choice, a link's rate and delay, a package list, a swarm's
placement, the host's GPUs and CPU facts. Each rule is the one the CLI's flag is checked with (plan/config,
plan/shares, plan/links), and says its own sentence of the key it is found at (strictyaml.by). Which key of the
file has which kind, and in what order the file writes them, is plan/labfile.py's model.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StringConstraints, WithJsonSchema

from tflab.plan import links as link_rules
from tflab.plan import shares
from tflab.plan.config import (
    KERAS_CHOICES,
    LabConfig,
    check_apt,
    check_host_label,
    check_image_ref,
    check_keras,
    check_one_line,
    check_pip,
    check_tensorflow,
)
from tflab.plan.gpus import Gpu
from tflab.plan.shares import HostFacts
from tflab.plan.strictyaml import KEY, Keys, NamedBy, Text, by, refused, ruled, shown

Json = dict[str, Any]


def one_of(*choices: str) -> Any:
    """A text that is one of `choices`."""
    def choose(value: Any) -> Any:
        if isinstance(value, str) and value.strip() and value not in choices:
            raise refused(f"{KEY} must be one of {', '.join(choices)}, not {value!r}")
        return value
    return Annotated[str, StringConstraints(pattern=r"\S"), BeforeValidator(choose),
                     WithJsonSchema({"enum": list(choices)})]


LabName = Annotated[Text, by(check_one_line)]
ImageRef = Annotated[Text, by(check_image_ref)]
Size = Annotated[Text, by(shares.size_bytes, keep=True)]


def _a_host(value: Any) -> Any:
    if not isinstance(value, str) or not value:
        raise refused(f"{KEY} must name a host, not {shown(value)}")
    return value


HostLabel = Annotated[str, BeforeValidator(_a_host), by(check_host_label)]


def _share(check: Any) -> Any:
    """A node's CPUs or memory: auto, 0 or an amount, as its flag reads it."""
    def read(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise refused(f"{KEY} must be auto, 0 or a number, not {shown(value)}")
        return str(ruled(check, str(value)))
    return Annotated[str, BeforeValidator(read), WithJsonSchema({"type": ["string", "number"],
                                                                 "description": "auto, 0 (no limit) or an amount"})]


CpuShare = _share(shares.check_cpu_choice)
MemoryShare = _share(shares.check_memory_choice)


TensorFlowPin = Annotated[Text, AfterValidator(lambda pin: ruled(lambda value, _: check_tensorflow(value), pin,
                                                                 f"{KEY}: ")),
                          Field(description="a TensorFlow version, such as '2.15.0'")]
Keras = Annotated[int, BeforeValidator(lambda value: ruled(check_keras, value)),
                  WithJsonSchema({"enum": [*KERAS_CHOICES, *map(str, KERAS_CHOICES)],
                                  "description": "2: Keras 2 (tf-keras) on today's TensorFlow; empty: its own Keras"})]
LinkRate = Annotated[Text, by(link_rules.parse_rate), Field(description="a rate, such as 1gbit or 100mbit")]


def _delay(value: Any) -> float | None:
    """Milliseconds each way (0: none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refused(f"{KEY} must be a number of milliseconds, not {shown(value)}")
    return ruled(link_rules.parse_delay, value)  # type: ignore[no-any-return]


LinkDelay = Annotated[float | None, BeforeValidator(_delay),
                      WithJsonSchema({"type": "number", "minimum": 0, "description": "milliseconds each way"})]


def _packages(check: Any) -> Any:
    """A list of packages, each as its flag (--pip, --apt) reads it."""
    def read(values: Any) -> tuple[str, ...]:
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise refused(f"{KEY} must be a list of texts, not {shown(values)}")
        return tuple(ruled(check, v) for v in values)
    return Annotated[tuple[str, ...], BeforeValidator(read),
                     WithJsonSchema({"type": "array", "items": {"type": "string"}})]


PipPackages = _packages(check_pip)
AptPackages = _packages(check_apt)


# -- the host's GPUs and CPU facts, as `gen` found them ---------------------------------------------


class GpuKeys(Keys):
    """One of the host's GPUs."""

    index: Annotated[int, Field(ge=0)]
    """Its index, as nvidia-smi numbers it."""
    uuid: Text | None = None
    """Its UUID (GPU-...)."""
    name: Text | None = None
    """Its model, such as NVIDIA H100 80GB HBM3."""
    memory_mib: Annotated[int, Field(ge=0)] | None = 0
    """Its memory in MiB."""

    def gpu(self) -> Gpu:
        return Gpu(index=self.index, uuid=self.uuid or "", name=self.name or "", memory_mib=self.memory_mib or 0)


def read_gpus(gpus: list[GpuKeys]) -> tuple[Gpu, ...]:
    return tuple(gpu.gpu() for gpu in gpus)


def write_gpus(config: LabConfig) -> list[dict[str, Any]]:
    return [{k: v for k, v in (("index", g.index), ("name", g.name), ("memory_mib", g.memory_mib)) if v or k == "index"}
            for g in config.gpus]


def _cpus(value: Any) -> tuple[int, ...]:
    if value in (None, ""):
        return ()
    try:
        return shares.parse_cpu_list(str(value))
    except ValueError:
        raise refused(f"{KEY} must be a CPU list such as 0-7,16-23, not {shown(value)}") from None


NUMBER = "^[0-9]+$"  # a NUMA node's or a GPU's number, as a mapping's key (its JSON Schema says the same: NamedBy)
GPU_TO_NUMA = "maps a GPU index to its NUMA node number"


def _number_key(sentence: str) -> Any:
    """A mapping's key that is a number written as a text (`"0"`), as YAML keeps it for JSON."""
    def read(key: Any) -> Any:
        if isinstance(key, str) and not re.fullmatch(NUMBER, key):
            raise refused(f"{KEY} {sentence}")
        return key
    return Annotated[str, BeforeValidator(read)]


def _numa_of(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise refused(f"{KEY} {GPU_TO_NUMA}")
    return value


CpuList = Annotated[tuple[int, ...], BeforeValidator(_cpus),
                    WithJsonSchema({"type": ["string", "integer"], "description": "a CPU list, such as 0-7,16-23"})]


class HostKeys(Keys):
    """The host's CPUs, their NUMA nodes and each GPU's, and its memory: what `gen` found, for the split."""

    cpus: CpuList | None = None
    """The CPUs the lab may use, such as 0-7,16-23."""
    numa: Annotated[dict[_number_key("must be a NUMA node number"), CpuList],  # type: ignore[valid-type]
                    NamedBy(NUMBER)] | None = None
    """Each NUMA node's CPUs."""
    gpu_numa: Annotated[dict[_number_key(GPU_TO_NUMA),  # type: ignore[valid-type]
                             Annotated[int, BeforeValidator(_numa_of)]],
                        NamedBy(NUMBER)] | None = None
    """Each GPU's NUMA node."""
    memory_mib: Annotated[int, Field(ge=0)] | None = 0
    """The host's memory in MiB."""

    def facts(self) -> HostFacts:
        return HostFacts(cpus=self.cpus or (), numa_cpus={int(node): cpus for node, cpus in (self.numa or {}).items()},
                         gpu_numa={int(gpu): node for gpu, node in (self.gpu_numa or {}).items()},
                         memory_mib=self.memory_mib or 0)


def write_host(config: LabConfig) -> dict[str, Any]:
    """The host's facts as tflab.yaml keeps them (CPU lists as the kernel writes them)."""
    facts = config.host
    return {"cpus": shares.cpu_list(facts.cpus),
            "numa": {str(node): shares.cpu_list(cpus) for node, cpus in sorted(facts.numa_cpus.items())},
            "gpu_numa": {str(gpu): node for gpu, node in sorted(facts.gpu_numa.items())},
            "memory_mib": facts.memory_mib}
