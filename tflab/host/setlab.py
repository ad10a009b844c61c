"""`tflab set`: an existing lab's settings changed with `gen`'s own options, everything else kept.

What is not asked for stays as tflab.yaml holds it (tasks, code, data, ports, name, the host's facts). Every value is
checked as `gen` checks it and the lab planned again before anything is written: a refusal changes nothing. What
changed is said key by key, as tflab.yaml names them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tflab.errors import UserError
from tflab.host import buildsettings, labfiles, proc
from tflab.host.labfiles import LabFiles
from tflab.host.newlab import lab_packages
from tflab.plan import config as cfg
from tflab.plan import links, shares
from tflab.plan.labfile import to_yaml
from tflab.plan.topology import plan
from tflab.render import image_files

NONE = "none"  # `--keras none`, `--tensorflow none`, `--link-rate none`: back to the default


@dataclass(frozen=True)
class SetRequest:
    """The settings asked for; None (or empty) keeps what the lab has."""

    nodes: int | None = None
    ps: int | None = None
    chief: bool | None = None
    evaluator: bool | None = None
    gpus_per_node: int | None = None
    cpus_per_node: str | None = None
    memory_per_node: str | None = None
    keras: str | None = None
    tensorflow: str | None = None
    pip: Sequence[str] | None = None  # added to the lab's
    apt: Sequence[str] | None = None  # added to the lab's
    base: str | None = None
    shm_size: str | None = None
    link_rate: str | None = None
    link_delay: str | None = None
    faults: bool | None = None
    tasks: Sequence[str] = field(default_factory=tuple)  # NAME=COMMAND: a task added, or its command changed
    drop_tasks: Sequence[str] = field(default_factory=tuple)

    def __bool__(self) -> bool:
        return any(value not in (None, (), []) for value in self.__dict__.values())


def changed_config(lf: LabFiles, request: SetRequest) -> cfg.LabConfig:
    """The lab's config with `request` applied, checked as `gen` checks it (UserError, naming the option)."""
    config = lf.config
    top = config.topology
    topology = replace(
        top,
        nodes=top.nodes if request.nodes is None else request.nodes,
        ps=top.ps if request.ps is None else request.ps,
        chief=top.chief if request.chief is None else request.chief,
        evaluator=top.evaluator if request.evaluator is None else request.evaluator,
        gpus_per_node=top.gpus_per_node if request.gpus_per_node is None else request.gpus_per_node,
        cpus_per_node=(top.cpus_per_node if request.cpus_per_node is None
                       else shares.check_cpu_choice(request.cpus_per_node)),
        memory_per_node=(top.memory_per_node if request.memory_per_node is None
                         else shares.check_memory_choice(request.memory_per_node)),
    )
    if topology.nodes < 1:
        raise UserError(f"--nodes must be 1 or more, not {topology.nodes}")
    plan(topology, config.gpus, config.host)  # a topology the lab's host cannot have is refused here
    keras = config.keras if request.keras is None else (None if request.keras == NONE else cfg.check_keras(request.keras))
    tensorflow = config.tensorflow if request.tensorflow is None else (
        None if request.tensorflow == NONE else request.tensorflow)
    if request.tensorflow is not None and request.tensorflow != NONE:
        cfg.check_tensorflow(request.tensorflow)
    if (keras, tensorflow) != (config.keras, config.tensorflow):
        buildsettings.check_keras_2(tensorflow, keras, proc.run)
    packages = config.packages
    if request.pip is not None or request.apt is not None:
        code = lf.resolve(config.code or cfg.CODE_DIR)
        pip = [*config.packages.pip, *(spec for spec in request.pip or () if spec not in config.packages.pip)]
        apt = [*config.packages.apt, *(name for name in request.apt or () if name not in config.packages.apt)]
        packages = lab_packages(pip, apt, code)
    if request.base is not None:
        cfg.check_image_ref(request.base, "--base")
    if request.shm_size is not None:
        shares.size_bytes(request.shm_size, "--shm-size")
    shaped = links.Links(
        rate=config.links.rate if request.link_rate is None else (
            None if request.link_rate == NONE else links.parse_rate(request.link_rate)),
        delay_ms=config.links.delay_ms if request.link_delay is None else (
            None if request.link_delay == NONE else links.parse_delay(request.link_delay)),
    )
    return replace(
        config, topology=topology, keras=keras, tensorflow=tensorflow, packages=packages,
        base_image=config.base_image if request.base is None else request.base,
        shm_size=config.shm_size if request.shm_size is None else request.shm_size,
        links=shaped, faults=config.faults if request.faults is None else request.faults,
        tasks=changed_tasks(config.tasks, request.tasks, request.drop_tasks),
    )


def changed_tasks(tasks: dict[str, cfg.Task], added: Sequence[str], dropped: Sequence[str]) -> dict[str, cfg.Task]:
    """The tasks with `NAME=COMMAND`s added (or their command changed, the rest of the task kept) and names dropped."""
    out = dict(tasks)
    for spec in added:
        name, sep, command = spec.partition("=")
        name = name.strip()
        if not sep or not command.strip():
            raise UserError(f"--task {spec!r}: write NAME=COMMAND (`--task train='python /workspace/train.py'`)")
        cfg.check_task_name(name)
        out[name] = replace(out[name], command=command.strip()) if name in out else cfg.Task(name, command.strip())
    for name in dropped:
        if name not in out:
            raise UserError(f"--drop-task {name}: the lab has no task {name!r} (its tasks: {', '.join(out) or 'none'})")
        del out[name]
    return out


def differences(before: cfg.LabConfig, after: cfg.LabConfig) -> list[str]:
    """`image.keras: null → 2`, key by key as tflab.yaml writes them."""
    old, new = _flat(yaml.safe_load(to_yaml(before))), _flat(yaml.safe_load(to_yaml(after)))
    said = []
    for key in [*old, *(k for k in new if k not in old)]:
        if old.get(key, _ABSENT) != new.get(key, _ABSENT):
            said.append(f"{key}: {_shown(old.get(key, _ABSENT))} → {_shown(new.get(key, _ABSENT))}")
    return said


_ABSENT = object()


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(doc, dict) and doc:
        return {k: v for key, value in doc.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): doc}


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(none)"
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def set_lab(root: Path, request: SetRequest) -> tuple[LabFiles, list[str]]:
    """Apply `request` to the lab in `root` and write it; the lab as written, and what changed."""
    if not request:
        raise UserError("name a setting to change (`tflab set --help` lists them: gen's options, and --task "
                        "NAME=COMMAND)")
    lf = labfiles.open_lab(root)
    config = changed_config(lf, request)
    changes = differences(lf.config, config)
    if changes:
        (lf.root / cfg.LAB_FILE).write_text(to_yaml(config))
        (lf.image_dir / "Dockerfile").write_text(image_files.dockerfile(config))
    return labfiles.open_lab(root), changes
